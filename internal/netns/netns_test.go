package netns

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The test binary runs itself inside a namespace as a helper: a listener
// that greets every connection, or a dialer that prints what it read.
const (
	helperListen = "NETNS_TEST_LISTEN"
	helperDial   = "NETNS_TEST_DIAL"
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(helperListen); addr != "" {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Println("listen:", err)
			os.Exit(1)
		}
		fmt.Println("listening")
		for {
			c, err := l.Accept()
			if err != nil {
				os.Exit(1)
			}
			fmt.Fprintln(c, "hello")
			c.Close()
		}
	}
	if addr := os.Getenv(helperDial); addr != "" {
		got, err := greet(addr)
		if err != nil {
			fmt.Println("dial:", err)
			os.Exit(1)
		}
		fmt.Println(got)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// greet reads the listener's line, within 2 s.
func greet(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// available skips without root or netns, but fails where CI is set: CI
// runs as root, and must not pass by skipping.
func available(t *testing.T) {
	t.Helper()
	if err := Available(t.Context()); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set, and network namespaces are not available: %v", err)
		}
		t.Skipf("network namespaces not available: %v", err)
	}
}

func TestLab(t *testing.T) {
	available(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	lab, err := New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lab.Close() })
	a, err := lab.Add(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := lab.Add(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if len(lab.HostAddr().String()) == 0 || a.Addr == b.Addr || !strings.HasPrefix(a.Addr.String(), "10.213.") {
		t.Fatalf("addresses: host %s, a %s, b %s", lab.HostAddr(), a.Addr, b.Addr)
	}
	for _, n := range []string{lab.bridge, a.HostIf, b.HostIf} {
		if len(n) > 15 {
			t.Errorf("interface name %q is longer than 15 characters", n)
		}
	}

	addr := net.JoinHostPort(a.Addr.String(), "7001")
	listener := a.Command(ctx, os.Args[0], "-test.run=^$")
	listener.Env = append(os.Environ(), helperListen+"="+addr)
	stdout, err := listener.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := listener.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = listener.Process.Kill()
		_ = listener.Wait()
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if strings.TrimSpace(line) != "listening" {
		t.Fatalf("listener in %s: %q, %v", a.NS, line, err)
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()

	fromB := func() (string, error) {
		d := b.Command(ctx, os.Args[0], "-test.run=^$")
		d.Env = append(os.Environ(), helperDial+"="+addr)
		out, err := d.Output()
		return strings.TrimSpace(string(out)), err
	}
	// The listener is only in a's namespace: not on the host's loopback.
	if _, err := greet("127.0.0.1:7001"); err == nil {
		t.Errorf("the listener in %s answers on the host's 127.0.0.1", a.NS)
	}
	if got, err := greet(addr); got != "hello" {
		t.Fatalf("host to %s: %q, %v", addr, got, err)
	}
	if got, err := fromB(); got != "hello" {
		t.Fatalf("%s to %s: %q, %v", b.NS, addr, got, err)
	}

	if err := lab.Cut(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if got, err := greet(addr); err == nil {
		t.Errorf("host to cut %s: %q", addr, got)
	}
	if got, err := fromB(); err == nil {
		t.Errorf("%s to cut %s: %q", b.NS, addr, got)
	}
	if err := lab.Heal(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if got, err := greet(addr); got != "hello" {
		t.Fatalf("host to healed %s: %q, %v", addr, got, err)
	}
	if got, err := fromB(); got != "hello" {
		t.Fatalf("%s to healed %s: %q, %v", b.NS, addr, got, err)
	}

	// Separated, a and b no longer reach each other; the host still
	// reaches a. Joined, b reaches a again.
	if err := lab.Separate(ctx, "a", "b"); err != nil {
		t.Fatal(err)
	}
	if got, err := fromB(); err == nil {
		t.Errorf("%s to %s separated from it: %q", b.NS, addr, got)
	}
	if got, err := greet(addr); got != "hello" {
		t.Fatalf("host to %s, separated from %s only: %q, %v", addr, b.NS, got, err)
	}
	if err := lab.Join(ctx, "a", "b"); err != nil {
		t.Fatal(err)
	}
	if got, err := fromB(); got != "hello" {
		t.Fatalf("%s to %s joined again: %q, %v", b.NS, addr, got, err)
	}

	_ = listener.Process.Kill()
	if err := lab.Close(); err != nil {
		t.Fatal(err)
	}
	if err := lab.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if left := leftovers(t, lab.Prefix()); len(left) > 0 {
		t.Errorf("after Close: %v", left)
	}
	if _, err := lab.Add(ctx, "c"); err == nil {
		t.Error("Add after Close succeeded")
	}
}

// TestStaleRemoved: what a lab of a dead process left is removed by the
// next New; a live process's lab is left alone.
func TestStaleRemoved(t *testing.T) {
	available(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	ip, err := ipPath()
	if err != nil {
		t.Fatal(err)
	}
	// A pid that is gone: a child that has exited and been reaped.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale := fmt.Sprintf("%s%da", namePrefix, dead.Process.Pid)
	if err := run(ctx, ip, "netns add "+stale+"-1-x", "link add "+stale+"br type bridge"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = run(context.Background(), ip, "netns del "+stale+"-1-x")
		_ = run(context.Background(), ip, "link del "+stale+"br")
	})
	live, err := New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	if left := leftovers(t, stale); len(left) > 0 {
		t.Errorf("stale names of dead pid %d left after New: %v", dead.Process.Pid, left)
	}
	other, err := New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if other.Prefix() == live.Prefix() || other.net == live.net {
		t.Errorf("two labs share prefix %s / %s, net %s / %s", live.Prefix(), other.Prefix(), live.net, other.net)
	}
	if left := leftovers(t, live.Prefix()); len(left) == 0 {
		t.Errorf("the first lab's bridge was removed by the second New")
	}
}

// leftovers lists the namespaces and links whose name starts with prefix.
func leftovers(t *testing.T, prefix string) []string {
	t.Helper()
	ip, err := ipPath()
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, args := range [][]string{{"netns", "list"}, {"-o", "link", "show"}} {
		out, err := output(context.Background(), ip, args...)
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(out) {
			for _, f := range strings.Fields(line) {
				if strings.HasPrefix(f, prefix) {
					left = append(left, f)
				}
			}
		}
	}
	return left
}
