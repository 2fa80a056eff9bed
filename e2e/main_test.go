package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/testlog"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// binary is the built chime; benchBinary, chime-bench, is beside it, so
// that the benches that run replicas run this chime.
var binary, benchBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "chime-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary, benchBinary = filepath.Join(dir, "chime"), filepath.Join(dir, "chime-bench")
	build := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "./cmd/chime", "./cmd/chime-bench")
	build.Dir = ".."
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build chime and chime-bench:", err)
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

// proc is one `chime serve` child.
type proc struct {
	cmd      *exec.Cmd
	httpAddr string
	id       string
	logs     *testlog.Buffer
	exited   chan error
	// https, when set, is the client of an HTTPS gateway (CHIME_HTTP_TLS_CERT).
	https *http.Client
}

func startServe(t testing.TB, id string, env ...string) *proc {
	t.Helper()
	return startServeAt(t, id, freeAddr(t), env...)
}

// startServeAt starts `chime serve` with its HTTP API on httpAddr, as a
// restart where clients reconnect to the same address.
func startServeAt(t testing.TB, id, httpAddr string, env ...string) *proc {
	t.Helper()
	p := spawnServe(t, id, httpAddr, env...)
	p.waitReady(t)
	return p
}

// spawnServe starts `chime serve` without waiting for it to be ready.
func spawnServe(t testing.TB, id, httpAddr string, env ...string) *proc {
	t.Helper()
	p := &proc{httpAddr: httpAddr, id: id, logs: &testlog.Buffer{}, exited: make(chan error, 1)}
	p.cmd = exec.Command(binary, "serve")
	// The tests create hundreds of timers per agent at once and repeat
	// every 500 ms, harder than the default limits let an agent; a test
	// about the limits sets its own (later entries win).
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
	get, url := http.Get, "http://"+p.httpAddr+"/readyz"
	if p.https != nil {
		get, url = p.https.Get, "https://"+p.httpAddr+"/readyz"
	}
	eventually(t, 20*time.Second, "replica "+p.id+" ready", func() bool {
		res, err := get(url)
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
}

func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// delivery is one timer_fired envelope read from the inbox stream.
type delivery struct {
	env    subjects.Envelope
	data   timers.TimerFiredData
	stored time.Time // when the inbox stream stored it
}

// inbox reads every envelope stored in the inbox stream. A read that
// fails (a cluster still settling after a kill answers "no responders"
// for a moment) is made again, for up to 20 s.
func inbox(t *testing.T, nc *nats.Conn) []delivery {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		out, err := readInbox(ctx, js)
		if err == nil {
			return out
		}
		if ctx.Err() != nil {
			t.Fatalf("read the inbox stream: %v", err)
		}
		t.Logf("read the inbox stream: %v; again", err)
		time.Sleep(200 * time.Millisecond)
	}
}

func readInbox(ctx context.Context, js jetstream.JetStream) ([]delivery, error) {
	stream, err := js.Stream(ctx, engine.InboxStream)
	if err != nil {
		return nil, err
	}
	total := int(stream.CachedInfo().State.Msgs)
	if total == 0 {
		return nil, nil
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	out := make([]delivery, 0, total)
	for len(out) < total {
		batch, err := cons.Fetch(min(total-len(out), 1000), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		for m := range batch.Messages() {
			var d delivery
			if err := json.Unmarshal(m.Data(), &d.env); err != nil {
				return nil, err
			}
			if err := json.Unmarshal(d.env.Data, &d.data); err != nil {
				return nil, err
			}
			if md, err := m.Metadata(); err == nil {
				d.stored = md.Timestamp
			}
			out = append(out, d)
		}
		if err := batch.Error(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// countInbox returns the number of stored inbox messages.
func countInbox(t *testing.T, nc *nats.Conn) int {
	t.Helper()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, engine.InboxStream)
	if err != nil {
		return 0
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0
	}
	return int(info.State.Msgs)
}
