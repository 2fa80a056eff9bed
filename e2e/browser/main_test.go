package browser_test

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// The harness below is the part of e2e/main_test.go (test code, so not
// importable) that the console tests use, copied: build chime, run
// `chime serve` children, wait for them.

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "chime-browser-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "chime")
	// Built in the main module, with its go.mod: the binary chime ships.
	build := exec.Command("go", "build", "-o", binary, "./cmd/chime")
	build.Dir = filepath.Join("..", "..")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build chime:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// syncBuffer collects a child's stderr for the test log.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is one `chime serve` child.
type proc struct {
	cmd      *exec.Cmd
	httpAddr string
	id       string
	logs     *syncBuffer
	exited   chan error
}

func startServe(t testing.TB, id string, env ...string) *proc {
	t.Helper()
	return startServeAt(t, id, freeAddr(t), env...)
}

// startServeAt starts `chime serve` with its HTTP API on httpAddr, as a
// restart where clients reconnect to the same address.
func startServeAt(t testing.TB, id, httpAddr string, env ...string) *proc {
	t.Helper()
	p := &proc{httpAddr: httpAddr, id: id, logs: &syncBuffer{}, exited: make(chan error, 1)}
	// A restart on the same address: another socket (an outgoing
	// connection's ephemeral port) may hold it for a moment.
	for free := time.Now().Add(10 * time.Second); ; {
		ln, err := net.Listen("tcp", httpAddr)
		if err == nil {
			ln.Close()
			break
		}
		if time.Now().After(free) {
			t.Fatalf("the address %s stays in use: %v", httpAddr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.cmd = exec.Command(binary, "serve")
	// As in e2e: the default limits are harder than the tests' load.
	harness := []string{"CHIME_CREATE_RATE=0", "CHIME_MIN_INTERVAL=100ms"}
	p.cmd.Env = append(append(os.Environ(), harness...), append(env, "CHIME_HTTP_ADDR="+p.httpAddr, "CHIME_REPLICA_ID="+id)...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("--- %s log ---\n%s", id, p.logs.String())
		}
	})
	p.waitReady(t)
	return p
}

func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	select {
	case <-p.exited:
		p.exited <- nil
	case <-time.After(10 * time.Second):
	}
}

func (p *proc) waitReady(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := http.Get("http://" + p.httpAddr + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %s ready: not within 20s", p.id)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
