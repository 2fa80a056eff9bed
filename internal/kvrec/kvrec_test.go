package kvrec_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/chime-nats/chime/internal/kvrec"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// engine is an embedded JetStream server a test can stop and start again
// on the same port and store, as a restart or a failover looks to a client.
type engine struct {
	t    *testing.T
	opts server.Options
	mu   sync.Mutex
	ns   *server.Server
}

func startEngine(t *testing.T) *engine {
	t.Helper()
	e := &engine{t: t, opts: server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true}}
	if err := e.start(); err != nil {
		t.Fatal(err)
	}
	e.opts.Port = e.ns.Addr().(*net.TCPAddr).Port // the same port on restart
	t.Cleanup(e.stop)
	return e
}

func (e *engine) start() error {
	opts := e.opts
	ns, err := server.NewServer(&opts)
	if err != nil {
		return err
	}
	ns.Start()
	if !ns.ReadyForConnections(5 * time.Second) {
		ns.Shutdown()
		return errors.New("server not ready")
	}
	e.mu.Lock()
	e.ns = ns
	e.mu.Unlock()
	return nil
}

func (e *engine) stop() {
	e.mu.Lock()
	ns := e.ns
	e.ns = nil
	e.mu.Unlock()
	if ns != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
	}
}

// restartAfter starts the server again after d; the returned channel
// reports how that went.
func (e *engine) restartAfter(d time.Duration) <-chan error {
	done := make(chan error, 1)
	time.AfterFunc(d, func() { done <- e.start() })
	return done
}

// connect returns a KV bucket on a connection that keeps reconnecting
// quickly, as chime's does.
func (e *engine) connect(t *testing.T) (*nats.Conn, jetstream.KeyValue) {
	t.Helper()
	js := e.jetstream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "recs"})
	if err != nil {
		t.Fatal(err)
	}
	return js.Conn(), kv
}

// jetstream returns JetStream on a connection that keeps reconnecting
// quickly, as chime's does.
func (e *engine) jetstream(t *testing.T) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(e.ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

type rec struct {
	ID      string `json:"id"`
	Changes int    `json:"changes"`
}

func put(t *testing.T, kv jetstream.KeyValue, key string, r rec) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, _, err := kvrec.Update(ctx, kv, key, true, func(v *rec) (bool, error) { *v = r; return true, nil }); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, kv jetstream.KeyValue, key string) rec {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, _, err := kvrec.Get[rec](ctx, kv, key)
	if err != nil {
		t.Fatal(err)
	}
	return *v
}

// bump is a change that is not idempotent on its own: applied twice, the
// record shows two changes.
func bump(calls *int) func(*rec) (bool, error) {
	return func(v *rec) (bool, error) {
		*calls++
		v.Changes++
		return true, nil
	}
}

// TestRetriedAcrossRestart stops the server and starts it again 500 ms
// later (same store, same port) while a call waits: each call rides it out
// within its deadline, and the update lands once.
func TestRetriedAcrossRestart(t *testing.T) {
	for _, tc := range []struct {
		name string
		call func(ctx context.Context, kv jetstream.KeyValue) error
	}{
		{"update", func(ctx context.Context, kv jetstream.KeyValue) error {
			var calls int
			_, changed, err := kvrec.Update(ctx, kv, "a.1", false, bump(&calls))
			if err == nil && !changed {
				err = errors.New("update reported no change")
			}
			return err
		}},
		{"get", func(ctx context.Context, kv jetstream.KeyValue) error {
			v, _, err := kvrec.Get[rec](ctx, kv, "a.1")
			if err == nil && v.ID != "one" {
				err = fmt.Errorf("got %+v", v)
			}
			return err
		}},
		{"list", func(ctx context.Context, kv jetstream.KeyValue) error {
			list, err := kvrec.List[rec](ctx, kv, "a.*")
			if err == nil && len(list) != 2 {
				err = fmt.Errorf("listed %d records, want 2", len(list))
			}
			return err
		}},
		{"create", func(ctx context.Context, kv jetstream.KeyValue) error {
			r := &rec{ID: "new"}
			_, _, err := kvrec.Create(ctx, kv, "a.new", r, func(s *rec) bool { return s.ID == r.ID })
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := startEngine(t)
			_, kv := e.connect(t)
			put(t, kv, "a.1", rec{ID: "one"})
			put(t, kv, "a.2", rec{ID: "two"})

			e.stop()
			restarted := e.restartAfter(500 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			start := time.Now()
			err := tc.call(ctx, kv)
			if rerr := <-restarted; rerr != nil {
				t.Fatalf("restart: %v", rerr)
			}
			if err != nil {
				t.Fatalf("%s across a restart: %v", tc.name, err)
			}
			if took := time.Since(start); took < 400*time.Millisecond {
				t.Fatalf("answered in %s, before the server was back", took)
			}
			if got := read(t, kv, "a.1"); tc.name == "update" && got.Changes != 1 {
				t.Fatalf("record shows %d changes, want 1", got.Changes)
			}
		})
	}
}

// lossy is a bucket whose writes land but whose answers are lost, as when
// the server fails over between storing a write and acknowledging it.
type lossy struct {
	jetstream.KeyValue
	mu   sync.Mutex
	lose int // answers still to lose
	// then, when set, runs after a write whose answer is lost: another
	// writer changing the record before the retry reads it.
	then func()
}

func (l *lossy) lost() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lose == 0 {
		return false
	}
	l.lose--
	return true
}

func (l *lossy) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	n, err := l.KeyValue.Update(ctx, key, value, rev)
	if err == nil && l.lost() {
		return 0, nats.ErrTimeout
	}
	return n, err
}

func (l *lossy) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	n, err := l.KeyValue.Create(ctx, key, value, opts...)
	if err == nil && l.lost() {
		if l.then != nil {
			l.then()
		}
		return 0, context.DeadlineExceeded // looks like an attempt's own timeout
	}
	return n, err
}

// TestLostAnswerAppliesOnce: a write that landed but whose answer was lost
// is found by the retry's read; the change is not applied a second time,
// and a create does not fail on its own record.
func TestLostAnswerAppliesOnce(t *testing.T) {
	e := startEngine(t)
	_, real := e.connect(t)
	kv := &lossy{KeyValue: real}
	put(t, kv, "a.1", rec{ID: "one"})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	kv.lose = 1
	var calls int
	v, _, changed, err := kvrec.UpdateRev(ctx, kv, "a.1", false, bump(&calls))
	if err != nil || !changed || v.Changes != 1 {
		t.Fatalf("update: %+v changed=%v err=%v", v, changed, err)
	}
	if got := read(t, kv, "a.1"); got.Changes != 1 || calls != 1 {
		t.Fatalf("record %+v after %d calls of change, want 1 change from 1 call", got, calls)
	}

	// Update's create path: the retry reads the record it wrote.
	kv.lose = 1
	calls = 0
	if _, changed, err := kvrec.Update(ctx, kv, "a.2", true, bump(&calls)); err != nil || !changed {
		t.Fatalf("create by update: changed=%v err=%v", changed, err)
	}
	if got := read(t, kv, "a.2"); got.Changes != 1 || calls != 1 {
		t.Fatalf("record %+v after %d calls of change, want 1 change from 1 call", got, calls)
	}

	// Create: the retry meets ErrKeyExists from its own write.
	kv.lose = 1
	r := &rec{ID: "three"}
	if _, _, err := kvrec.Create(ctx, kv, "a.3", r, func(s *rec) bool { return s.ID == r.ID }); err != nil {
		t.Fatalf("create: %v", err)
	}
	// Changed by someone else before the retry read it (a timer fired at
	// once): mine recognises it by its identity.
	kv.lose = 1
	four := &rec{ID: "four"}
	kv.then = func() {
		var calls int
		if _, _, err := kvrec.Update(ctx, real, "a.4", false, bump(&calls)); err != nil {
			t.Error(err)
		}
	}
	if _, _, err := kvrec.Create(ctx, kv, "a.4", four, func(s *rec) bool { return s.ID == four.ID }); err != nil {
		t.Fatalf("create changed meanwhile: %v", err)
	}
	kv.then = nil
	if got := read(t, kv, "a.4"); got.Changes != 1 {
		t.Fatalf("record %+v, want the other writer's change kept", got)
	}
	// Someone else's record under the key is still a conflict.
	other := &rec{ID: "other"}
	if _, _, err := kvrec.Create(ctx, kv, "a.3", other, func(s *rec) bool { return s.ID == other.ID }); !errors.Is(err, jetstream.ErrKeyExists) {
		t.Fatalf("create over another record: %v, want ErrKeyExists", err)
	}
}

// TestUnavailableUntilDeadline: with the server down for longer than the
// deadline, every call ends at the deadline with an error that is
// Transient and ErrUnavailable.
func TestUnavailableUntilDeadline(t *testing.T) {
	e := startEngine(t)
	_, kv := e.connect(t)
	put(t, kv, "a.1", rec{ID: "one"})
	e.stop()
	for name, call := range map[string]func(context.Context) error{
		"get": func(ctx context.Context) error { _, _, err := kvrec.Get[rec](ctx, kv, "a.1"); return err },
		"list": func(ctx context.Context) error {
			_, err := kvrec.List[rec](ctx, kv, "a.*")
			return err
		},
		"update": func(ctx context.Context) error {
			var calls int
			_, _, err := kvrec.Update(ctx, kv, "a.1", false, bump(&calls))
			return err
		},
		"create": func(ctx context.Context) error {
			_, _, err := kvrec.Create(ctx, kv, "a.9", &rec{ID: "nine"}, func(*rec) bool { return false })
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const deadline = time.Second
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			err := call(ctx)
			took := time.Since(start)
			if !kvrec.Transient(err) || !errors.Is(err, kvrec.ErrUnavailable) {
				t.Fatalf("error %v: want Transient and ErrUnavailable", err)
			}
			if took < deadline-50*time.Millisecond || took > deadline+time.Second {
				t.Fatalf("returned after %s, want about the %s deadline", took, deadline)
			}
		})
	}
}

// TestCallerCancelIsNotUnavailable: a caller that gives up is told so,
// not that the storage is unavailable.
func TestCallerCancelIsNotUnavailable(t *testing.T) {
	e := startEngine(t)
	_, kv := e.connect(t)
	e.stop()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	_, _, err := kvrec.Get[rec](ctx, kv, "a.1")
	if !errors.Is(err, context.Canceled) || errors.Is(err, kvrec.ErrUnavailable) {
		t.Fatalf("error %v: want context.Canceled", err)
	}
}

// TestCurrent: an update from the caller's copy writes without a read when
// the copy is current, and decides again from the stored record when it is
// stale; a purge by CAS refuses a stale revision.
func TestCurrent(t *testing.T) {
	e := startEngine(t)
	_, kv := e.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	put(t, kv, "a.1", rec{ID: "a"})
	v, rev, err := kvrec.Get[rec](ctx, kv, "a.1")
	if err != nil {
		t.Fatal(err)
	}
	var calls int
	if _, rev, _, err = kvrec.UpdateRev(ctx, kv, "a.1", false, bump(&calls), kvrec.Current(v, rev)); err != nil || calls != 1 {
		t.Fatalf("update from a current copy: %v after %d calls", err, calls)
	}
	stale := &rec{ID: "a"} // Changes 0, at a revision long gone
	if _, _, _, err := kvrec.UpdateRev(ctx, kv, "a.1", false, bump(&calls), kvrec.Current(stale, rev-1)); err != nil {
		t.Fatal(err)
	}
	if got := read(t, kv, "a.1"); got.Changes != 2 || calls != 3 {
		t.Fatalf("after a stale copy: %+v after %d calls, want 2 changes (the stale decision lost its CAS and was made again)", got, calls)
	}
	r := kvrec.Retention{}
	if err := r.PurgeRev(ctx, kv, "a.1", rev); !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		t.Fatalf("purge at a stale revision: %v, want ErrKeyRevisionMismatch", err)
	}
	_, cur, err := kvrec.Get[rec](ctx, kv, "a.1")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.PurgeRev(ctx, kv, "a.1", cur); err != nil {
		t.Fatal(err)
	}
	if _, _, err := kvrec.Get[rec](ctx, kv, "a.1"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("after the purge: %v", err)
	}
}
