package natsproc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/natsproc"
	"github.com/chime-nats/chime/internal/natsproc/natsproctest"
)

// connect makes a client that reconnects forever, as chime's own does, with
// a channel signalled on every reconnect.
func connect(t *testing.T, urls string) (*nats.Conn, jetstream.JetStream, <-chan struct{}) {
	t.Helper()
	reconnected := make(chan struct{}, 16)
	nc, err := nats.Connect(urls,
		nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond),
		nats.ReconnectHandler(func(*nats.Conn) {
			select {
			case reconnected <- struct{}{}:
			default:
			}
		}),
	)
	if err != nil {
		t.Fatalf("connect %s: %v", urls, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js, reconnected
}

func TestStandaloneKillRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	s := natsproctest.Standalone(t)
	nc, js, reconnected := connect(t, s.ClientURL())

	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FAULT", Subjects: []string{"fault.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	for i := range 100 {
		if _, err := js.Publish(ctx, "fault.a", fmt.Appendf(nil, "m%d", i)); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}

	pid := s.Pid()
	s.Kill()
	if s.Running() {
		t.Fatal("running after Kill")
	}
	start := time.Now()
	s.Restart()
	t.Logf("restart of %s (pid %d -> %d) ready in %v", s.Name(), pid, s.Pid(), time.Since(start))

	select {
	case <-reconnected:
		t.Logf("client reconnected %v after restart began", time.Since(start))
	case <-ctx.Done():
		t.Fatalf("client did not reconnect: status %v", nc.Status())
	}
	st, err := js.Stream(ctx, "FAULT")
	if err != nil {
		t.Fatalf("stream after restart: %v", err)
	}
	if n := st.CachedInfo().State.Msgs; n != 100 {
		t.Fatalf("stream has %d msgs after SIGKILL and restart, want 100", n)
	}
	ack, err := js.Publish(ctx, "fault.a", []byte("after"))
	if err != nil {
		t.Fatalf("publish after restart: %v", err)
	}
	if ack.Sequence != 101 {
		t.Fatalf("publish after restart got seq %d, want 101", ack.Sequence)
	}

	// A graceful stop and a start keep the store too.
	s.Stop()
	s.Start()
	st, err = js.Stream(ctx, "FAULT")
	if err != nil {
		t.Fatalf("stream after stop and start: %v", err)
	}
	if n := st.CachedInfo().State.Msgs; n != 101 {
		t.Fatalf("stream has %d msgs after stop and start, want 101", n)
	}
}

func TestClusterStreamLeaderKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 28*time.Second)
	defer cancel()
	begin := time.Now()
	c := natsproctest.Cluster(t, 3)
	t.Logf("3 servers accepting connections in %v", time.Since(begin))
	c.WaitJetStreamReady(ctx)
	t.Logf("JetStream ready in %v", time.Since(begin))

	_, js, _ := connect(t, c.URLs())
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Replicas: 3, Storage: jetstream.FileStorage}); err != nil {
		t.Fatalf("create R3 stream: %v", err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "STATE", Replicas: 3})
	if err != nil {
		t.Fatalf("create R3 bucket: %v", err)
	}
	for i := range 10 {
		if _, err := js.Publish(ctx, "orders.new", fmt.Appendf(nil, "o%d", i)); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	if _, err := kv.Put(ctx, "k", []byte("v1")); err != nil {
		t.Fatalf("kv put: %v", err)
	}

	leader, err := c.StreamLeader(ctx, js, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	kvLeader, err := c.KVLeader(ctx, js, "STATE")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stream leader %s, kv leader %s", leader.Name(), kvLeader.Name())

	killed := time.Now()
	leader.Kill()
	next, err := c.WaitStreamLeader(ctx, js, "ORDERS", leader)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("new stream leader %s elected %v after SIGKILL of %s", next.Name(), time.Since(killed), leader.Name())

	if _, err := js.Publish(ctx, "orders.new", []byte("after-kill")); err != nil {
		t.Fatalf("publish after leader kill: %v", err)
	}
	if kvLeader == leader {
		if _, err := c.WaitStreamLeader(ctx, js, "KV_STATE", leader); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kv.Put(ctx, "k", []byte("v2")); err != nil {
		t.Fatalf("kv put after leader kill: %v", err)
	}
	t.Logf("publish and kv put work %v after SIGKILL", time.Since(killed))

	restarted := time.Now()
	leader.Restart()
	for _, stream := range []string{"ORDERS", "KV_STATE"} {
		if err := c.WaitStreamCurrent(ctx, js, stream); err != nil {
			t.Fatalf("%s after restart of %s: %v", stream, leader.Name(), err)
		}
	}
	t.Logf("%s rejoined, all replicas current %v after restart", leader.Name(), time.Since(restarted))

	st, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != 11 {
		t.Fatalf("ORDERS has %d msgs, want 11", n)
	}
	e, err := kv.Get(ctx, "k")
	if err != nil {
		t.Fatalf("kv get: %v", err)
	}
	if string(e.Value()) != "v2" {
		t.Fatalf("kv k = %q, want v2", e.Value())
	}
}

// TestStartError: a binary that is not there, or a client port another
// listener holds, is an error from natsproc, not a panic, and leaves no
// process behind.
func TestStartError(t *testing.T) {
	t.Run("bad binary", func(t *testing.T) {
		bin := filepath.Join(t.TempDir(), "no-nats-server")
		s, err := natsproc.New(natsproc.Options{Bin: bin})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		defer s.Close()
		err = s.Start()
		if !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("Start with %s: %v, want an error wrapping os.ErrNotExist", bin, err)
		}
		if s.Running() {
			t.Fatal("running after a failed start")
		}
		if _, err := natsproc.Standalone(natsproc.Options{Bin: bin}); err == nil {
			t.Fatal("Standalone with a bad binary: no error")
		}
	})
	t.Run("port in use", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		port := l.Addr().(*net.TCPAddr).Port
		dir := t.TempDir()
		s, err := natsproc.Standalone(natsproc.Options{ClientPort: port, Dir: dir, Logf: t.Logf})
		if err == nil {
			s.Close()
			t.Fatalf("Standalone on port %d, held by a listener: no error", port)
		}
		t.Logf("port in use: %v", err)
		if s != nil {
			t.Fatal("a server returned with the error")
		}
		if _, err := os.Stat(filepath.Join(dir, "server.log")); err != nil {
			t.Fatalf("the log is not kept in the given dir: %v", err)
		}
	})
}
