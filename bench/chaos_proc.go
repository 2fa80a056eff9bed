package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/chime-nats/chime/internal/natsproc"
)

// workDir is a run's work dir (the servers' stores and logs, and the
// replicas' logs) with the cleanups that stop its processes, run by close.
type workDir struct {
	dir      string
	logf     func(format string, args ...any)
	mu       sync.Mutex
	dirs     int
	cleanups []func() error
}

func newWorkDir(logf func(string, ...any)) (*workDir, error) {
	dir, err := os.MkdirTemp("", "chime-chaos-")
	if err != nil {
		return nil, fmt.Errorf("bench: work dir: %w", err)
	}
	return &workDir{dir: dir, logf: logf}, nil
}

// Cleanup registers f to run at close.
func (w *workDir) Cleanup(f func() error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cleanups = append(w.cleanups, f)
}

// natsOptions are the options of a natsproc start: its files in a new
// directory under the work dir, its notes to the run's progress.
func (w *workDir) natsOptions() natsproc.Options {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.dirs++
	return natsproc.Options{Dir: filepath.Join(w.dir, fmt.Sprintf("natsproc-%d", w.dirs)), Logf: w.logf}
}

// standalone starts a standalone nats-server in the work dir, closed by close.
func (w *workDir) standalone() (*natsproc.Server, error) {
	s, err := natsproc.Standalone(w.natsOptions())
	if err != nil {
		return nil, err
	}
	w.Cleanup(s.Close)
	return s, nil
}

// cluster starts a cluster of n nats-servers in the work dir, closed by
// close, and waits until JetStream can place streams on all of them.
func (w *workDir) cluster(ctx context.Context, n int, each func(int, *natsproc.Options)) (*natsproc.ClusterT, error) {
	c, err := natsproc.ClusterEach(n, w.natsOptions(), each)
	if err != nil {
		return nil, err
	}
	w.Cleanup(c.Close)
	if err := c.WaitJetStreamReady(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// close runs the cleanups, last registered first; the work dir stays.
func (w *workDir) close() {
	w.mu.Lock()
	fs := w.cleanups
	w.cleanups = nil
	w.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		if err := fs[i](); err != nil {
			w.logf("cleanup: %v", err)
		}
	}
}

// replicaProc is one `chime serve` child. Its output is appended to its
// log file across restarts, each start marked by a line.
type replicaProc struct {
	id, httpAddr, logPath, exe string
	pprofAddr                  string // serving /debug/pprof; empty: not
	env                        []string
	wrap                       []string // command prefix, e.g. ip netns exec; it must exec exe

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	starts int
}

func (p *replicaProc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("replica %s: already running", p.id)
	}
	p.starts++
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("replica %s: log: %w", p.id, err)
	}
	fmt.Fprintf(f, "=== chaos: start %d of %s at %s ===\n", p.starts, p.id, time.Now().Format(time.RFC3339Nano))
	argv := append(slices.Clone(p.wrap), p.exe, "serve")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = sysProcAttr()
	err = cmd.Start()
	f.Close()
	if err != nil {
		return fmt.Errorf("replica %s: start %s serve: %w", p.id, p.exe, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	p.cmd, p.done = cmd, done
	return nil
}

// kill sends SIGKILL and waits for the process to exit.
func (p *replicaProc) kill() error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd, p.done = nil, nil
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("replica %s: SIGKILL: %w", p.id, err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("replica %s: still running 10s after SIGKILL", p.id)
	}
}

func (p *replicaProc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// waitReady polls /readyz until it answers 200, the process exits, or d
// passes.
func (p *replicaProc) waitReady(ctx context.Context, d time.Duration) error {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return fmt.Errorf("replica %s: not running", p.id)
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	c := http.Client{Timeout: time.Second}
	for {
		if res, err := c.Get("http://" + p.httpAddr + "/readyz"); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-done:
			return fmt.Errorf("replica %s: exited while starting (see %s)", p.id, p.logPath)
		case <-ctx.Done():
			if err := parent.Err(); err != nil { // the run was ended, not the replica slow
				return fmt.Errorf("replica %s: not ready: %w", p.id, err)
			}
			return fmt.Errorf("replica %s: not ready within %v (see %s)", p.id, d, p.logPath)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
