package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// procTB gives natsproc, written for tests, what it needs outside one: a
// work dir (the servers' stores and logs, and the replicas' logs), cleanups
// run by close, and a Fatalf that panics with a fatalError, which guard
// turns back into an error where the bench called natsproc.
type procTB struct {
	dir      string
	logf     func(format string, args ...any)
	mu       sync.Mutex
	dirs     int
	cleanups []func()
	failed   bool
}

// fatalError is the panic value of procTB.Fatalf.
type fatalError struct{ msg string }

func newProcTB(logf func(string, ...any)) (*procTB, error) {
	dir, err := os.MkdirTemp("", "chime-chaos-")
	if err != nil {
		return nil, fmt.Errorf("bench: work dir: %w", err)
	}
	return &procTB{dir: dir, logf: logf}, nil
}

func (t *procTB) Helper() {}

func (t *procTB) Logf(format string, args ...any) { t.logf(format, args...) }

func (t *procTB) Errorf(format string, args ...any) {
	t.fail()
	t.logf(format, args...)
}

func (t *procTB) Fatalf(format string, args ...any) {
	t.fail()
	panic(fatalError{msg: fmt.Sprintf(format, args...)})
}

func (t *procTB) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

// TempDir returns a new directory under the work dir.
func (t *procTB) TempDir() string {
	t.mu.Lock()
	t.dirs++
	dir := filepath.Join(t.dir, fmt.Sprintf("natsproc-%d", t.dirs))
	t.mu.Unlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("bench: temp dir: %v", err)
	}
	return dir
}

func (t *procTB) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}

func (t *procTB) fail() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failed = true
}

// close runs the cleanups, last registered first; the work dir stays.
func (t *procTB) close() {
	t.mu.Lock()
	fs := t.cleanups
	t.cleanups = nil
	t.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		if err := guard(fs[i]); err != nil {
			t.logf("cleanup: %v", err)
		}
	}
}

// guard runs f, a call into natsproc, and returns the message of a
// procTB.Fatalf as an error; any other panic goes on.
func guard(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			fe, ok := r.(fatalError)
			if !ok {
				panic(r)
			}
			err = errors.New(fe.msg)
		}
	}()
	f()
	return nil
}

// replicaProc is one `chime serve` child. Its output is appended to its
// log file across restarts, each start marked by a line.
type replicaProc struct {
	id, httpAddr, logPath, exe string
	pprofAddr                  string // serving /debug/pprof; empty: not
	env                        []string

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
	cmd := exec.Command(p.exe, "serve")
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
			return fmt.Errorf("replica %s: not ready within %v (see %s)", p.id, d, p.logPath)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
