package natsproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
)

// Options configure one nats-server process. Ports and store stay fixed for
// the life of the Server, so a restart comes back as the same peer.
type Options struct {
	// Name is the server_name. JetStream ties a store to it, so it must stay
	// the same across restarts. Default: "natsproc-<client port>".
	Name string
	// Host is the address the server listens on, for clients and routes,
	// and the host of its URLs. Default: 127.0.0.1.
	Host string
	// Wrap, when set, is the command prefix the binary runs under, e.g.
	// "ip netns exec ns1" to run it in a network namespace. It must exec
	// the server, so that Kill and Stop signal the server itself.
	Wrap []string
	// ClientPort is the client port on Host. Default: a free port.
	ClientPort int
	// ClusterPort is the route port on Host; 0 means no cluster.
	ClusterPort int
	// ClusterName defaults to "chime" when ClusterPort is set.
	ClusterName string
	// Routes are the route URLs to solicit, e.g. "nats://127.0.0.1:6222".
	Routes []string
	// Dir holds the config file, the log and, by default, the store.
	// Default: a new temporary directory, removed by Close.
	Dir string
	// StoreDir is the JetStream store directory. Default: Dir/store.
	StoreDir string
	// Bin is the nats-server binary. Default: Binary().
	Bin string
	// Logf, when set, is told why a fallback binary is used.
	Logf func(format string, args ...any)
	// Config is appended to the generated config, e.g. an authorization
	// block.
	Config string
	// ConnectOptions are what a client needs to connect (credentials
	// when Config turns authorization on); the readiness check uses them.
	ConnectOptions []nats.Option
}

// Server is one nats-server process. Its methods return errors that carry
// the tail of the server's log; Close kills it for good.
type Server struct {
	bin      string
	opts     Options
	dir      string
	ownDir   bool // dir was made by New, and Close removes it
	confPath string
	logPath  string

	mu     sync.Mutex
	proc   *proc // the last process started; nil after Kill or Stop
	starts int
}

// proc is one run of the binary; err is set before done is closed.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// New configures a server without starting it. Close kills it and removes
// the directory New made, if it made one.
func New(opts Options) (*Server, error) {
	bin := opts.Bin
	if bin == "" {
		b, err := findBinary()
		if err != nil {
			return nil, err
		}
		if b.note != "" && opts.Logf != nil {
			opts.Logf("natsproc: %s", b.note)
		}
		bin = b.path
	}
	if opts.ClientPort == 0 {
		ports, err := FreePorts(1)
		if err != nil {
			return nil, err
		}
		opts.ClientPort = ports[0]
	}
	if opts.Name == "" {
		opts.Name = fmt.Sprintf("natsproc-%d", opts.ClientPort)
	}
	dir, ownDir := opts.Dir, false
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "natsproc-"); err != nil {
			return nil, fmt.Errorf("natsproc: server %s: %w", opts.Name, err)
		}
		ownDir = true
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("natsproc: server %s: %w", opts.Name, err)
	}
	if opts.StoreDir == "" {
		opts.StoreDir = filepath.Join(dir, "store")
	}
	opts.Routes = slices.Clone(opts.Routes)
	opts.Wrap = slices.Clone(opts.Wrap)
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	if opts.ClusterPort != 0 && opts.ClusterName == "" {
		opts.ClusterName = "chime"
	}
	s := &Server{
		bin:      bin,
		opts:     opts,
		dir:      dir,
		ownDir:   ownDir,
		confPath: filepath.Join(dir, "server.conf"),
		logPath:  filepath.Join(dir, "server.log"),
	}
	if err := os.WriteFile(s.confPath, []byte(s.config()), 0o644); err != nil {
		if ownDir {
			_ = os.RemoveAll(dir)
		}
		return nil, fmt.Errorf("natsproc: server %s: write config: %w", opts.Name, err)
	}
	return s, nil
}

// Standalone starts a single JetStream server (named "standalone" unless
// opts names it) with a file store and waits until it accepts connections.
func Standalone(opts Options) (*Server, error) {
	if opts.Name == "" {
		opts.Name = "standalone"
	}
	s, err := New(opts)
	if err != nil {
		return nil, err
	}
	if err := s.Start(); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

// config is a config file rather than flags because JetStream clustering
// needs server_name, cluster name and routes all consistent, and the file
// is left next to the log for whoever reads a failure.
func (s *Server) config() string {
	var b strings.Builder
	fmt.Fprintf(&b, "server_name: %s\n", quote(s.opts.Name))
	fmt.Fprintf(&b, "listen: %s\n", quote(net.JoinHostPort(s.opts.Host, strconv.Itoa(s.opts.ClientPort))))
	fmt.Fprintf(&b, "jetstream {\n  store_dir: %s\n}\n", quote(s.opts.StoreDir))
	// As the runbook asks of chime's servers: a client cut off by the
	// network is dropped after two unanswered pings (2-4 s: a busy
	// client's first ping waits a quiet second), not the default 2
	// minutes during which its queue subscriptions still take requests.
	b.WriteString("ping_interval: \"1s\"\nping_max: 2\n")
	if s.opts.ClusterPort != 0 {
		fmt.Fprintf(&b, "cluster {\n  name: %s\n  listen: %s\n", quote(s.opts.ClusterName), quote(net.JoinHostPort(s.opts.Host, strconv.Itoa(s.opts.ClusterPort))))
		if len(s.opts.Routes) > 0 {
			b.WriteString("  routes: [\n")
			for _, r := range s.opts.Routes {
				fmt.Fprintf(&b, "    %s\n", quote(r))
			}
			b.WriteString("  ]\n")
		}
		b.WriteString("}\n")
	}
	b.WriteString(s.opts.Config)
	return b.String()
}

// quote makes a double-quoted config string; the config lexer knows only a
// few escapes, so this escapes just backslash and quote.
func quote(v string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(v) + `"`
}

// Name is the server_name, which JetStream reports as a leader or peer.
func (s *Server) Name() string { return s.opts.Name }

// ClientURL is the client URL, the same across restarts.
func (s *Server) ClientURL() string { return s.url(s.opts.ClientPort) }

func (s *Server) url(port int) string {
	return "nats://" + net.JoinHostPort(s.opts.Host, strconv.Itoa(port))
}

// ClusterURL is the route URL, empty without a cluster port.
func (s *Server) ClusterURL() string {
	if s.opts.ClusterPort == 0 {
		return ""
	}
	return s.url(s.opts.ClusterPort)
}

// StoreDir is the JetStream store directory, kept across restarts.
func (s *Server) StoreDir() string { return s.opts.StoreDir }

// LogPath is the file the server's output goes to, appended across restarts.
func (s *Server) LogPath() string { return s.logPath }

// Running reports whether the process was started and not yet seen to exit.
func (s *Server) Running() bool {
	p := s.current()
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Pid is the process id of the last start, 0 after Kill or Stop.
func (s *Server) Pid() int {
	if p := s.current(); p != nil {
		return p.cmd.Process.Pid
	}
	return 0
}

func (s *Server) current() *proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

// Start starts the process and waits until it answers a NATS ping.
func (s *Server) Start() error {
	if err := s.spawn(); err != nil {
		return err
	}
	return s.waitReady()
}

// Restart starts the server again on the same ports and store, killing it
// first with SIGKILL if it is still running, and waits until it answers a
// NATS ping.
func (s *Server) Restart() error {
	if err := s.Kill(); err != nil {
		return err
	}
	return s.Start()
}

// Kill sends SIGKILL, the way operators lose a server, and waits for the
// process to exit. It does nothing if the server is not running.
func (s *Server) Kill() error {
	p := s.current()
	if p == nil {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return s.fail(fmt.Errorf("SIGKILL: %w", err))
	}
	if !p.wait(killTimeout) {
		return s.fail(fmt.Errorf("still running %v after SIGKILL", killTimeout))
	}
	s.clear(p)
	return nil
}

// Stop sends SIGTERM, which makes nats-server shut down cleanly, and waits
// for it to exit. A server that does not exit in time is killed, and that
// is an error.
func (s *Server) Stop() error {
	p := s.current()
	if p == nil {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return s.fail(fmt.Errorf("SIGTERM: %w", err))
	}
	if !p.wait(stopTimeout) {
		err := s.Kill()
		return errors.Join(s.fail(fmt.Errorf("did not exit within %v of SIGTERM; killed", stopTimeout)), err)
	}
	s.clear(p)
	if p.err != nil {
		return s.fail(fmt.Errorf("exit after SIGTERM: %w", p.err))
	}
	return nil
}

// Close kills the server if it runs and removes the directory New made
// (one given as Options.Dir stays, with the log). It is safe to call more
// than once.
func (s *Server) Close() error {
	if p := s.current(); p != nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		if !p.wait(killTimeout) {
			return fmt.Errorf("natsproc: server %s (pid %d) still running %v after SIGKILL", s.opts.Name, p.cmd.Process.Pid, killTimeout)
		}
		s.clear(p)
	}
	if s.ownDir {
		if err := os.RemoveAll(s.dir); err != nil {
			return fmt.Errorf("natsproc: server %s: %w", s.opts.Name, err)
		}
	}
	return nil
}

func (p *proc) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

func (s *Server) clear(p *proc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == p {
		s.proc = nil
	}
}

func (s *Server) spawn() error {
	if err := s.trySpawn(); err != nil {
		return s.fail(err)
	}
	return nil
}

func (s *Server) trySpawn() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		select {
		case <-s.proc.done: // it died by itself; starting it again is what the caller wants
		default:
			return errors.New("already running")
		}
	}
	s.starts++
	f, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	// The child writes to the file directly: no copying goroutine to leak,
	// and the log survives a test binary that dies mid-test.
	fmt.Fprintf(f, "=== natsproc: start %d of %s at %s ===\n", s.starts, s.opts.Name, time.Now().Format(time.RFC3339Nano))
	argv := append(slices.Clone(s.opts.Wrap), s.bin, "-c", s.confPath)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = sysProcAttr()
	err = cmd.Start()
	f.Close()
	if err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	s.proc = p
	return nil
}

// waitReady polls until a nats.go connection to the server flushes (a PING
// answered by a PONG), which implies the TCP listener is up.
func (s *Server) waitReady() error {
	p := s.current()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	var last error
	for {
		if last = ping(ctx, s.ClientURL(), s.opts.ConnectOptions); last == nil {
			return nil
		}
		select {
		case <-p.done:
			s.clear(p)
			err := p.err
			if err == nil {
				err = errors.New("exit status 0")
			}
			return s.fail(fmt.Errorf("exited while starting: %w", err))
		case <-ctx.Done():
			return s.fail(fmt.Errorf("not accepting connections within %v: %w", readyTimeout, last))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func ping(ctx context.Context, url string, opts []nats.Option) error {
	nc, err := nats.Connect(url, append(slices.Clone(opts), nats.Timeout(time.Second), nats.NoReconnect(), nats.Name("natsproc-ready"))...)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	return nil
}

// LogTailLines is how many lines of the log an error carries.
const LogTailLines = 40

// fail is err with the server's name and the tail of its log.
func (s *Server) fail(err error) error {
	return fmt.Errorf("natsproc: server %s: %w\n--- log tail (%s) ---\n%s", s.opts.Name, err, s.logPath, s.LogTail(LogTailLines))
}

// LogTail returns the last n lines of the server's log.
func (s *Server) LogTail(n int) string {
	f, err := os.Open(s.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	// A tail needs only the end of the file; servers can log megabytes.
	const window = 64 << 10
	if st, err := f.Stat(); err == nil && st.Size() > window {
		if _, err := f.Seek(-window, io.SeekEnd); err != nil {
			return fmt.Sprintf("(log: %v)", err)
		}
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
