// Package netns owns a small network lab on this Linux machine, for fault
// runs that need real network partitions: a bridge with a host address on
// a private /24, and per member a network namespace joined to the bridge
// by a veth pair. Cutting a member sets its host-side veth down, so its
// TCP connections stall without resets, as in a real partition; healing
// sets it up again.
//
// Everything a Lab creates is named with its prefix "chp<pid><letter>":
// Close deletes it, and New first deletes what labs of dead processes left
// behind. It needs root and the ip tool of iproute2, nothing else.
package netns

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// namePrefix starts every name a Lab gives; the pid after it says whose.
const namePrefix = "chp"

// maxMembers keeps member interface names within 15 characters.
const maxMembers = 99

// ipTimeout bounds one ip invocation; they take milliseconds.
const ipTimeout = 10 * time.Second

// Lab is one bridge and the namespaces of its members.
type Lab struct {
	ip     string // the ip binary
	prefix string // chp<pid><letter>
	bridge string
	net    netip.Prefix // the /24
	host   netip.Addr   // the bridge's address

	mu      sync.Mutex
	members []*Member
	closed  bool
}

// Member is one namespace of a Lab.
type Member struct {
	Name   string     // as given to Add
	NS     string     // the namespace's name
	HostIf string     // the veth end on the bridge, which Cut sets down
	Addr   netip.Addr // the address inside the namespace
	ip     string
}

// Wrap is the command prefix that runs a command inside the namespace:
// ip netns exec execs the command, so its pid is the command's own.
func (m *Member) Wrap() []string { return []string{m.ip, "netns", "exec", m.NS} }

// Command is exec.CommandContext of name and args inside the namespace.
func (m *Member) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	w := m.Wrap()
	return exec.CommandContext(ctx, w[0], append(append(w[1:], name), args...)...)
}

// ipPath finds ip: /usr/sbin is often not in a non-login PATH.
func ipPath() (string, error) {
	if p, err := exec.LookPath("ip"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"} {
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	return "", errors.New("netns: no ip tool (iproute2) in PATH or /usr/sbin")
}

// Available says why a Lab cannot be made here, nil if it can: root, the
// ip tool, and a namespace that can really be added and deleted.
func Available(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return errors.New("netns: not root")
	}
	ip, err := ipPath()
	if err != nil {
		return err
	}
	probe := fmt.Sprintf("%s%dprobe", namePrefix, os.Getpid())
	if err := run(ctx, ip, "netns add "+probe); err != nil {
		return fmt.Errorf("netns: cannot add a namespace: %w", err)
	}
	if err := run(ctx, ip, "netns del "+probe); err != nil {
		return fmt.Errorf("netns: cannot delete a namespace: %w", err)
	}
	return nil
}

// New makes a lab: removes stale leftovers of dead processes, then makes
// the bridge with a host address on a /24 of 10.213.0.0/16 that no route
// of this machine uses yet.
func New(ctx context.Context) (*Lab, error) {
	ip, err := ipPath()
	if err != nil {
		return nil, err
	}
	if err := removeStale(ctx, ip); err != nil {
		return nil, err
	}
	pid := os.Getpid()
	l := &Lab{ip: ip}
	// The bridge's creation is what claims a prefix: adding an existing
	// link fails, so two labs of one process never share one.
	for c := 'a'; ; c++ {
		if c > 'z' {
			return nil, errors.New("netns: 26 labs in this process already")
		}
		l.prefix = fmt.Sprintf("%s%d%c", namePrefix, pid, c)
		l.bridge = l.prefix + "br"
		err := run(ctx, ip, fmt.Sprintf("link add %s type bridge", l.bridge))
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "exists") {
			return nil, fmt.Errorf("netns: add bridge: %w", err)
		}
	}
	if err := l.address(ctx, pid); err != nil {
		return nil, errors.Join(err, l.Close())
	}
	return l, nil
}

// address picks the /24 and gives the bridge its .1.
func (l *Lab) address(ctx context.Context, pid int) error {
	routes, err := output(ctx, l.ip, "-4", "route", "show", "table", "all")
	if err != nil {
		return fmt.Errorf("netns: routes: %w", err)
	}
	for i := range 250 {
		x := (pid+i)%250 + 1
		p := netip.MustParsePrefix(fmt.Sprintf("10.213.%d.0/24", x))
		if routeOverlaps(routes, p) {
			continue
		}
		l.net = p
		l.host = p.Addr().Next()
		err := run(ctx, l.ip, fmt.Sprintf("addr add %s/24 dev %s", l.host, l.bridge), fmt.Sprintf("link set %s up", l.bridge))
		if err != nil {
			return fmt.Errorf("netns: bridge %s address %s: %w", l.bridge, l.host, err)
		}
		return nil
	}
	return errors.New("netns: every /24 of 10.213.0.0/16 is routed already")
}

// routeOverlaps reports whether a route other than a default one covers
// or lies within p.
func routeOverlaps(routes string, p netip.Prefix) bool {
	for line := range strings.Lines(routes) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		dst := f[0]
		if dst == "broadcast" || dst == "local" || dst == "unicast" {
			if len(f) < 2 {
				continue
			}
			dst = f[1]
		}
		if dst == "default" {
			continue
		}
		if !strings.Contains(dst, "/") {
			dst += "/32"
		}
		q, err := netip.ParsePrefix(dst)
		if err != nil {
			continue
		}
		if q.Overlaps(p) {
			return true
		}
	}
	return false
}

// Prefix is the names' prefix; every name the lab makes starts with it.
func (l *Lab) Prefix() string { return l.prefix }

// HostAddr is the host's address on the bridge.
func (l *Lab) HostAddr() netip.Addr { return l.host }

// Add makes a member: a namespace with lo up and a veth whose inside end
// has the next address of the /24.
func (l *Lab) Add(ctx context.Context, name string) (*Member, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, errors.New("netns: lab closed")
	}
	for _, m := range l.members {
		if m.Name == name {
			return nil, fmt.Errorf("netns: member %s exists", name)
		}
	}
	i := len(l.members) + 1
	if i > maxMembers {
		return nil, fmt.Errorf("netns: more than %d members", maxMembers)
	}
	addr := l.host
	for range 9 + i { // members from .10 on
		addr = addr.Next()
	}
	m := &Member{
		Name:   name,
		NS:     fmt.Sprintf("%s-%d-%s", l.prefix, i, name),
		HostIf: fmt.Sprintf("%sh%d", l.prefix, i),
		Addr:   addr,
		ip:     l.ip,
	}
	inner := fmt.Sprintf("%sn%d", l.prefix, i)
	// Recorded before creation, so Close deletes what a failure half made.
	l.members = append(l.members, m)
	err := run(ctx, l.ip,
		"netns add "+m.NS,
		fmt.Sprintf("link add %s type veth peer name %s netns %s", m.HostIf, inner, m.NS),
		fmt.Sprintf("link set %s master %s", m.HostIf, l.bridge),
		fmt.Sprintf("link set %s up", m.HostIf),
	)
	if err == nil {
		// A batch line takes no -n: the namespace's own lines are a
		// batch of ip -n.
		err = run(ctx, l.ip+" -n "+m.NS,
			"link set lo up",
			fmt.Sprintf("addr add %s/24 dev %s", m.Addr, inner),
			fmt.Sprintf("link set %s up", inner),
		)
	}
	if err != nil {
		return nil, fmt.Errorf("netns: add member %s: %w", name, err)
	}
	return m, nil
}

// Member returns the member added under name, nil if none.
func (l *Lab) Member(name string) *Member {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.members {
		if m.Name == name {
			return m
		}
	}
	return nil
}

// Cut isolates the member: its veth loses its link, so packets to and from
// it are dropped and its TCP connections stall, with no reset sent.
func (l *Lab) Cut(ctx context.Context, name string) error { return l.setLink(ctx, name, "down") }

// Heal gives a cut member its link back.
func (l *Lab) Heal(ctx context.Context, name string) error { return l.setLink(ctx, name, "up") }

func (l *Lab) setLink(ctx context.Context, name, state string) error {
	m := l.Member(name)
	if m == nil {
		return fmt.Errorf("netns: no member %s", name)
	}
	if err := run(ctx, l.ip, fmt.Sprintf("link set %s %s", m.HostIf, state)); err != nil {
		return fmt.Errorf("netns: set %s (%s) %s: %w", name, m.HostIf, state, err)
	}
	return nil
}

// Close deletes the members' veths and namespaces and the bridge. It kills
// no process: a process left inside keeps a namespace alive, unnamed and
// without its veth. It may be called more than once.
func (l *Lab) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	// Cleanup runs on every exit path, a cancelled context's too.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	for _, m := range l.members {
		// The host end is deleted explicitly: a namespace still held by
		// a process would keep the pair alive.
		errs = append(errs, del(ctx, l.ip, "link", m.HostIf), del(ctx, l.ip, "netns", m.NS))
	}
	errs = append(errs, del(ctx, l.ip, "link", l.bridge))
	return errors.Join(errs...)
}

// del deletes a link or a namespace, and is content when it is gone.
func del(ctx context.Context, ip, what, name string) error {
	err := run(ctx, ip, fmt.Sprintf("%s del %s", what, name))
	if err == nil || gone(err) {
		return nil
	}
	return fmt.Errorf("netns: delete %s %s: %w", what, name, err)
}

func gone(err error) bool {
	s := err.Error()
	return strings.Contains(s, "Cannot find device") || strings.Contains(s, "No such file") || strings.Contains(s, "does not exist")
}

// ownerRe matches a name a Lab made, capturing its pid.
var ownerRe = regexp.MustCompile(`^` + namePrefix + `(\d+)[a-z]`)

// removeStale deletes the namespaces and links whose prefix names a
// process that is gone: a lab whose process crashed before its Close.
func removeStale(ctx context.Context, ip string) error {
	stale := func(name string) bool {
		mm := ownerRe.FindStringSubmatch(name)
		if mm == nil {
			return false
		}
		pid, err := strconv.Atoi(mm[1])
		return err == nil && !alive(pid)
	}
	nsOut, err := output(ctx, ip, "netns", "list")
	if err != nil {
		return fmt.Errorf("netns: list namespaces: %w", err)
	}
	linkOut, err := output(ctx, ip, "-o", "link", "show")
	if err != nil {
		return fmt.Errorf("netns: list links: %w", err)
	}
	var errs []error
	for line := range strings.Lines(nsOut) {
		f := strings.Fields(line)
		if len(f) > 0 && stale(f[0]) {
			errs = append(errs, del(ctx, ip, "netns", f[0]))
		}
	}
	for line := range strings.Lines(linkOut) {
		// "12: chp123ah1@if11: <...": the name is the second field.
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if stale(name) {
			errs = append(errs, del(ctx, ip, "link", name))
		}
	}
	return errors.Join(errs...)
}

// alive reports whether a process with the pid exists (EPERM: it does,
// someone else's).
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// run runs ip -batch with one command per line; it stops at the first
// failure, whose message it returns. ip may carry options after the
// binary's path ("/usr/sbin/ip -n ns1").
func run(ctx context.Context, ip string, lines ...string) error {
	ctx, cancel := context.WithTimeout(ctx, ipTimeout)
	defer cancel()
	argv := append(strings.Fields(ip), "-batch", "-")
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip -batch %q: %w: %s", lines, err, strings.TrimSpace(out.String()))
	}
	return nil
}

func output(ctx context.Context, ip string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, ipTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, ip, args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(ee.Stderr)))
		}
		return "", fmt.Errorf("ip %s: %w", strings.Join(args, " "), err)
	}
	return string(out), nil
}
