package kvwatch_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/chime-nats/chime/internal/kvwatch"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testwait"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// view is what a watch's user keeps.
type view struct {
	mu     sync.Mutex
	vals   map[string]string
	resets int
}

func (v *view) apply(e kvwatch.Entry) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if e.Deleted {
		delete(v.vals, e.Key)
		return
	}
	v.vals[e.Key] = string(e.Value)
}

func (v *view) reset() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.vals = map[string]string{}
	v.resets++
}

func (v *view) get(k string) (string, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	s, ok := v.vals[k]
	return s, ok
}

func (v *view) len() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.vals)
}

// restartable is an embedded JetStream server on a fixed port and store,
// so it can be shut down and started again the way a restart looks to
// clients.
type restartable struct {
	opts *server.Options
	ns   *server.Server
}

func startServer(t *testing.T) *restartable {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	r := &restartable{opts: &server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, ServerName: "kvwatch-" + strconv.Itoa(port)}}
	r.start(t)
	t.Cleanup(func() { r.ns.Shutdown(); r.ns.WaitForShutdown() })
	return r
}

func (r *restartable) start(t *testing.T) {
	t.Helper()
	ns, err := server.NewServer(r.opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	r.ns = ns
}

func connect(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
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

func waitLoaded(t *testing.T, w *kvwatch.Watch) {
	t.Helper()
	select {
	case <-w.Loaded():
	case <-time.After(5 * time.Second):
		_, why := w.Live()
		t.Fatalf("not loaded: %s", why)
	}
}

func bucket(t *testing.T, js jetstream.JetStream, name string) jetstream.KeyValue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: name, History: 1})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func TestLoadsThenFollows(t *testing.T) {
	srv := startServer(t)
	js := connect(t, srv.ns.ClientURL())
	kv := bucket(t, js, "w")
	ctx := context.Background()
	for i := range 100 {
		if _, err := kv.Put(ctx, "k"+strconv.Itoa(i), []byte("v1")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kv.Put(ctx, "k0", []byte("v2")); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, "k1"); err != nil {
		t.Fatal(err)
	}
	v := &view{vals: map[string]string{}}
	w := kvwatch.New(kvwatch.Config{JS: js, Bucket: "w", Apply: v.apply, Reset: v.reset})
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(context.Background())
	select {
	case <-w.Loaded():
	case <-time.After(5 * time.Second):
		t.Fatal("not loaded")
	}
	if got, _ := v.get("k0"); got != "v2" || v.len() != 99 {
		t.Fatalf("loaded k0=%q, %d keys", got, v.len())
	}
	rev, err := kv.Put(ctx, "new", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := w.WaitSeen(wctx, rev); err != nil {
		t.Fatal(err)
	}
	if got, ok := v.get("new"); !ok || got != "x" {
		t.Fatalf("new = %q %v", got, ok)
	}
	if live, why := w.Live(); !live {
		t.Fatalf("not live: %s", why)
	}
}

func TestEmptyBucketLoads(t *testing.T) {
	srv := startServer(t)
	js := connect(t, srv.ns.ClientURL())
	bucket(t, js, "empty")
	v := &view{vals: map[string]string{}}
	w := kvwatch.New(kvwatch.Config{JS: js, Bucket: "empty", Apply: v.apply})
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(context.Background())
	select {
	case <-w.Loaded():
	case <-time.After(5 * time.Second):
		t.Fatal("empty bucket never loaded")
	}
}

// TestSurvivesServerRestart: the server goes away and comes back on the
// same store; the watch says it is not live meanwhile, then follows
// changes made after the restart without missing any.
func TestSurvivesServerRestart(t *testing.T) {
	srv := startServer(t)
	js := connect(t, srv.ns.ClientURL())
	kv := bucket(t, js, "r")
	ctx := context.Background()
	if _, err := kv.Put(ctx, "before", []byte("1")); err != nil {
		t.Fatal(err)
	}
	v := &view{vals: map[string]string{}}
	w := kvwatch.New(kvwatch.Config{JS: js, Bucket: "r", Apply: v.apply, Reset: v.reset, Heartbeat: 500 * time.Millisecond})
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(context.Background())
	waitLoaded(t, w)
	srv.ns.Shutdown()
	srv.ns.WaitForShutdown()
	testwait.Eventually(t, 10*time.Second, func() bool { live, _ := w.Live(); return !live }, "watch reports not live")
	srv.start(t)
	var rev uint64
	testwait.Eventually(t, 10*time.Second, func() bool {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		r, err := kv.Put(pctx, "after", []byte("2"))
		rev = r
		return err == nil
	}, "put after restart")
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := w.WaitSeen(wctx, rev); err != nil {
		t.Fatal(err)
	}
	if _, ok := v.get("after"); !ok {
		t.Fatal("change after the restart not applied")
	}
	if _, ok := v.get("before"); !ok || v.resets != 0 {
		t.Fatalf("view lost its state (resets %d)", v.resets)
	}
	testwait.Eventually(t, 10*time.Second, func() bool { live, _ := w.Live(); return live }, "live again")
}

// TestReloadsRecreatedBucket: a bucket deleted and made anew restarts its
// sequence; the view is reset and reloaded rather than waiting for
// revisions that will never come.
func TestReloadsRecreatedBucket(t *testing.T) {
	srv := startServer(t)
	js := connect(t, srv.ns.ClientURL())
	kv := bucket(t, js, "re")
	ctx := context.Background()
	for i := range 20 {
		if _, err := kv.Put(ctx, "old"+strconv.Itoa(i), []byte("1")); err != nil {
			t.Fatal(err)
		}
	}
	v := &view{vals: map[string]string{}}
	w := kvwatch.New(kvwatch.Config{JS: js, Bucket: "re", Apply: v.apply, Reset: v.reset, Heartbeat: 500 * time.Millisecond})
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(context.Background())
	waitLoaded(t, w)
	if err := js.DeleteKeyValue(ctx, "re"); err != nil {
		t.Fatal(err)
	}
	kv = bucket(t, js, "re")
	if _, err := kv.Put(ctx, "fresh", []byte("1")); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, func() bool {
		_, ok := v.get("fresh")
		return ok && v.len() == 1
	}, "reloaded")
	if v.resets < 1 {
		t.Fatal("no reset")
	}
}

// TestExpiredKeyIsDeleted: a key whose TTL runs out leaves the server's
// deletion marker (no KV-Operation header, no value); a watch following
// the bucket, and one loading it while the marker is there, both see a
// deletion, never an empty value.
func TestExpiredKeyIsDeleted(t *testing.T) {
	srv := startServer(t)
	js := connect(t, srv.ns.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "ttl", History: 1, LimitMarkerTTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "stays", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, "goes", []byte("1"), jetstream.KeyTTL(time.Second)); err != nil {
		t.Fatal(err)
	}
	watch := func() (*view, *kvwatch.Watch) {
		v := &view{vals: map[string]string{}}
		w := kvwatch.New(kvwatch.Config{JS: js, Bucket: "ttl", Apply: func(e kvwatch.Entry) {
			if !e.Deleted && len(e.Value) == 0 {
				t.Errorf("%s at %d applied as an empty value", e.Key, e.Revision)
			}
			v.apply(e)
		}})
		if err := w.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Stop(context.Background()) })
		waitLoaded(t, w)
		return v, w
	}
	following, _ := watch()
	if _, ok := following.get("goes"); !ok {
		t.Fatal("the key with a TTL was not loaded")
	}
	testwait.Eventually(t, 10*time.Second, func() bool { _, ok := following.get("goes"); return !ok }, "expired key deleted")
	loading, _ := watch() // the marker is the key's last message now
	if _, ok := loading.get("goes"); ok || loading.len() != 1 || following.len() != 1 {
		t.Fatalf("after expiry: following %d keys, loading %d keys", following.len(), loading.len())
	}
	if _, err := kv.Get(ctx, "goes"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("get of an expired key: %v", err)
	}
}

// TestKeys: a watch of a key pattern loads and follows those keys alone,
// and Seen counts their revisions.
func TestKeys(t *testing.T) {
	srv := startServer(t)
	js := connect(t, srv.ns.ClientURL())
	kv := bucket(t, js, "keys")
	ctx := context.Background()
	for _, k := range []string{"idx.a", "rec.a", "idx.b.c"} {
		if _, err := kv.Put(ctx, k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	v := &view{vals: map[string]string{}}
	w := kvwatch.New(kvwatch.Config{JS: js, Bucket: "keys", Keys: "idx.>", Apply: v.apply, Reset: v.reset})
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(context.Background())
	waitLoaded(t, w)
	rev, err := kv.Put(ctx, "idx.d", []byte("d"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "rec.d", []byte("d")); err != nil {
		t.Fatal(err)
	}
	if err := w.WaitSeen(ctx, rev); err != nil {
		t.Fatal(err)
	}
	_, rec := v.get("rec.a")
	if n := v.len(); n != 3 || rec || w.Seen() != rev {
		t.Fatalf("view of %d keys (rec.a in it: %v), seen %d: want idx.a, idx.b.c and idx.d alone, seen %d", n, rec, w.Seen(), rev)
	}
}

// TestReplay: a view that kept only some keys widens what it keeps and
// replays; after the replay it holds every key's current value, changes
// made during the replay included, and what it had applied comes again
// marked Again.
func TestReplay(t *testing.T) {
	srv := startServer(t)
	js := connect(t, srv.ns.ClientURL())
	kv := bucket(t, js, "r")
	ctx := context.Background()
	for i := range 200 {
		if _, err := kv.Put(ctx, "k"+strconv.Itoa(i), []byte("v1")); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu     sync.Mutex
		wide   bool
		again  int
		repeat int // an Again entry whose key the view did not skip
	)
	v := &view{vals: map[string]string{}}
	keep := func(k string) bool { n, _ := strconv.Atoi(k[1:]); return wide || n%2 == 0 }
	w := kvwatch.New(kvwatch.Config{JS: js, Bucket: "r", Apply: func(e kvwatch.Entry) {
		mu.Lock()
		defer mu.Unlock()
		if e.Again {
			again++
			if _, held := v.get(e.Key); held && !e.Deleted {
				repeat++
			}
		}
		if keep(e.Key) {
			v.apply(e)
		}
	}})
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(context.Background())
	waitLoaded(t, w)
	if v.len() != 100 {
		t.Fatalf("kept %d keys, want the 100 even ones", v.len())
	}
	if err := kv.Delete(ctx, "k0"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	wide = true
	mu.Unlock()
	first := w.Replay()
	second := w.Replay() // coalesced into the same replay or queued behind it
	// Changes while the replay runs must land too.
	for i := range 200 {
		if _, err := kv.Put(ctx, "k"+strconv.Itoa(i), []byte("v2")); err != nil {
			t.Fatal(err)
		}
	}
	for _, done := range []<-chan struct{}{first, second} {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("replay never caught up")
		}
	}
	testwait.Eventually(t, 10*time.Second, func() bool {
		for i := range 200 {
			if got, _ := v.get("k" + strconv.Itoa(i)); got != "v2" {
				return false
			}
		}
		return true
	}, "every key at v2")
	mu.Lock()
	defer mu.Unlock()
	if again == 0 {
		t.Fatal("no entry came marked Again")
	}
	if repeat == 0 {
		t.Fatal("the replay delivered no already applied key it held")
	}
	if live, why := w.Live(); !live {
		t.Fatalf("not live after replays: %s", why)
	}
}

// TestReplayQueuedBehindReplay: requests during a replay are served by one
// more replay after it, not by restarting it.
func TestReplayQueuedBehindReplay(t *testing.T) {
	srv := startServer(t)
	js := connect(t, srv.ns.ClientURL())
	kv := bucket(t, js, "q")
	ctx := context.Background()
	for i := range 2000 {
		if _, err := kv.Put(ctx, "k"+strconv.Itoa(i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	var applied sync.Map
	w := kvwatch.New(kvwatch.Config{JS: js, Bucket: "q", Apply: func(e kvwatch.Entry) {
		n, _ := applied.LoadOrStore(e.Key, new(int))
		*(n.(*int))++
	}})
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(context.Background())
	waitLoaded(t, w)
	var chans []<-chan struct{}
	for range 20 {
		chans = append(chans, w.Replay())
	}
	for i, done := range chans {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("replay %d never caught up", i)
		}
	}
	// The load and at most two replays: one started at once, one queued.
	n, _ := applied.Load("k1999")
	if got := *(n.(*int)); got < 2 || got > 3 {
		t.Fatalf("k1999 applied %d times, want 2 or 3", got)
	}
}

// TestStatusShapedMessages: a message with no body and a Status header
// (what a JetStream pull stores when its reply subject is a bucket's) looks
// to the client library like a server status, which it drops. The watch
// passes such a message over, wherever it is: in the load, between
// changes, last in the bucket; it neither stalls nor loses a change.
func TestStatusShapedMessages(t *testing.T) {
	srv := startServer(t)
	js := connect(t, srv.ns.ClientURL())
	kv := bucket(t, js, "s")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc := js.Conn()
	junk := func(key string) uint64 {
		t.Helper()
		m := &nats.Msg{Subject: "$KV.s." + key, Header: nats.Header{"Status": []string{"404"}, "Description": []string{"No Messages"}}}
		ack, err := js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	if _, err := kv.Put(ctx, "a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	junk("loaded")
	if _, err := kv.Put(ctx, "b", []byte("1")); err != nil {
		t.Fatal(err)
	}
	v := &view{vals: map[string]string{}}
	w := kvwatch.New(kvwatch.Config{JS: js, Bucket: "s", Apply: v.apply, Reset: v.reset})
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(context.Background())
	waitLoaded(t, w)
	if a, _ := v.get("a"); a != "1" {
		t.Fatalf("a = %q", a)
	}
	if b, _ := v.get("b"); b != "1" {
		t.Fatalf("b = %q", b)
	}
	// Between two changes, then last of all.
	junk("between")
	rev, err := kv.Put(ctx, "c", []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WaitSeen(ctx, rev); err != nil {
		t.Fatal(err)
	}
	if c, _ := v.get("c"); c != "1" {
		t.Fatalf("c = %q", c)
	}
	last := junk("last")
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if err := w.WaitSeen(wctx, last); err != nil {
		t.Fatalf("waiting past a status-shaped message last in the bucket: %v", err)
	}
	rev, err = kv.Put(ctx, "d", []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WaitSeen(ctx, rev); err != nil {
		t.Fatal(err)
	}
	if d, _ := v.get("d"); d != "1" {
		t.Fatalf("d = %q", d)
	}
	if live, why := w.Live(); !live {
		t.Fatalf("not live: %s", why)
	}
	_ = nc
}

// TestCaughtUpWhenPendingStaysAboveZero: a load or replay is complete once
// every change is applied, even when the last delivery the watch gets
// still counts messages pending. The server's running count does that
// after a message replaced while its consumer passed over it (seen under
// load: a replica's replay then waited for the bucket's next change, and
// the shards it had gained never fired); a status-shaped message last in
// the bucket, which the server delivers and the client library drops,
// makes the same count here deterministically.
func TestCaughtUpWhenPendingStaysAboveZero(t *testing.T) {
	srv := startServer(t)
	js := connect(t, srv.ns.ClientURL())
	kv := bucket(t, js, "p")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	junk := func() {
		t.Helper()
		m := &nats.Msg{Subject: "$KV.p.junk", Header: nats.Header{"Status": []string{"404"}, "Description": []string{"No Messages"}}}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		if _, err := kv.Put(ctx, "k"+strconv.Itoa(i), []byte("1")); err != nil {
			t.Fatal(err)
		}
	}
	junk()
	v := &view{vals: map[string]string{}}
	w := kvwatch.New(kvwatch.Config{JS: js, Bucket: "p", Apply: v.apply, Reset: v.reset})
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(context.Background())
	waitLoaded(t, w)
	if v.len() != 10 {
		t.Fatalf("loaded %d keys, want 10", v.len())
	}
	// A replay, with changes while it runs and the junk last again.
	done := w.Replay()
	for i := range 10 {
		if _, err := kv.Put(ctx, "k"+strconv.Itoa(i), []byte("2")); err != nil {
			t.Fatal(err)
		}
	}
	junk()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the replay never caught up")
	}
	testwait.Eventually(t, 10*time.Second, func() bool {
		for i := range 10 {
			if got, _ := v.get("k" + strconv.Itoa(i)); got != "2" {
				return false
			}
		}
		return true
	}, "every key at 2")
	// The watch goes on with changes after it.
	rev, err := kv.Put(ctx, "after", []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WaitSeen(ctx, rev); err != nil {
		t.Fatal(err)
	}
	if live, why := w.Live(); !live {
		t.Fatalf("not live: %s", why)
	}
}

// TestLoadsABucketOfOnlyAStatusShapedMessage: a bucket whose one message
// the client library drops, far into its sequence, loads too.
func TestLoadsABucketOfOnlyAStatusShapedMessage(t *testing.T) {
	srv := startServer(t)
	js := connect(t, srv.ns.ClientURL())
	kv := bucket(t, js, "o")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 100 {
		if _, err := kv.Put(ctx, "k", []byte("1")); err != nil {
			t.Fatal(err)
		}
	}
	st, err := js.Stream(ctx, "KV_o")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(ctx); err != nil { // no marker left behind
		t.Fatal(err)
	}
	m := &nats.Msg{Subject: "$KV.o.junk", Header: nats.Header{"Status": []string{"404"}}}
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	v := &view{vals: map[string]string{}}
	w := kvwatch.New(kvwatch.Config{JS: js, Bucket: "o", Apply: v.apply, Reset: v.reset})
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(context.Background())
	waitLoaded(t, w)
	if v.len() != 0 {
		t.Fatalf("loaded %d keys, want none", v.len())
	}
}

// TestLoadOfAConsumerThatDeliversNothingIsMadeAgain: a consumer the server
// counts messages pending for, and delivers none of, is made anew while
// the watch loads, as one whose heartbeats went missing is. A load waits
// at most a heartbeat for each delivery (to look at a quiet consumer),
// and nats.go watches heartbeats only within one wait: in chime-bench
// chaos a shard's load stayed at "13 pending, 0 delivered" while a
// cluster's server restarted, and the shard, held, never fired. A paused
// consumer delivers nothing in the same way here.
func TestLoadOfAConsumerThatDeliversNothingIsMadeAgain(t *testing.T) {
	srv := startServer(t)
	js := connect(t, srv.ns.ClientURL())
	kv := bucket(t, js, "d")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 2000 {
		if _, err := kv.Put(ctx, "k"+strconv.Itoa(i), []byte("1")); err != nil {
			t.Fatal(err)
		}
	}
	st, err := js.Stream(ctx, "KV_d")
	if err != nil {
		t.Fatal(err)
	}
	// The first consumer is paused as soon as it exists: its first
	// deliveries, at most a pull's worth, may arrive, and then none.
	paused := make(chan struct{})
	go func() {
		defer close(paused)
		for ctx.Err() == nil {
			names := st.ConsumerNames(ctx)
			for name := range names.Name() {
				if _, err := js.PauseConsumer(ctx, "KV_d", name, time.Now().Add(time.Minute)); err == nil {
					return
				}
			}
			time.Sleep(time.Millisecond)
		}
	}()
	var applied atomic.Int64
	v := &view{vals: map[string]string{}}
	apply := func(e kvwatch.Entry) {
		if applied.Add(1) == 1 {
			<-paused // the pause lands before the first pull is drained
		}
		v.apply(e)
	}
	w := kvwatch.New(kvwatch.Config{JS: js, Bucket: "d", Apply: apply, Reset: v.reset, Heartbeat: 500 * time.Millisecond})
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(context.Background())
	select {
	case <-w.Loaded():
	case <-time.After(10 * time.Second):
		t.Fatalf("not loaded 10 s after its consumer stopped delivering (%d applied)", applied.Load())
	}
	if v.len() != 2000 {
		t.Fatalf("loaded %d keys, want 2000", v.len())
	}
}

// TestConsumersOnTheLeader watches an R3 bucket on a three-server cluster
// with several watches: each one's consumer is on the server that leads
// the bucket's stream, the copy that holds every acknowledged record (a
// copy catching up after a partition counts as current to its leader, and
// a view loaded from it missed what the catch-up stored). The server
// places each on one of the three at random.
func TestConsumersOnTheLeader(t *testing.T) {
	js, kv := natstest.ClusterKV(t, "placed")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	const watches = 6
	for i := range watches {
		v := &view{vals: map[string]string{}}
		w := kvwatch.New(kvwatch.Config{JS: js, Bucket: "placed", Apply: v.apply})
		if err := w.StartLoaded(ctx); err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
		defer w.Stop(context.Background())
	}
	stream, err := js.Stream(ctx, "KV_placed")
	if err != nil {
		t.Fatal(err)
	}
	leader := stream.CachedInfo().Cluster.Leader
	n := 0
	for info := range stream.ListConsumers(ctx).Info() {
		n++
		if on := info.Cluster.Leader; on != leader {
			t.Errorf("consumer %s on %s, the stream's leader is %s", info.Name, on, leader)
		}
	}
	if n != watches {
		t.Errorf("%d consumers, want one per watch (%d): misplaced ones are deleted", n, watches)
	}
}

// TestLiveWatchOfAStalledConsumer pauses a live watch's consumer (the
// server keeps it, counts messages pending for it and answers its pulls
// with heartbeats, but delivers nothing: what a consumer did after a heal
// in chime-bench chaos) and writes a key: the watch looks at its quiet
// consumer, finds it stalled, and makes a new one, so the change arrives
// within seconds rather than when the pause ends.
func TestLiveWatchOfAStalledConsumer(t *testing.T) {
	srv := startServer(t)
	js := connect(t, srv.ns.ClientURL())
	kv := bucket(t, js, "s")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v := &view{vals: map[string]string{}}
	w := kvwatch.New(kvwatch.Config{JS: js, Bucket: "s", Apply: v.apply})
	if err := w.StartLoaded(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(context.Background())
	stream, err := js.Stream(ctx, "KV_s")
	if err != nil {
		t.Fatal(err)
	}
	names := stream.ConsumerNames(ctx)
	var paused int
	for name := range names.Name() {
		if _, err := js.PauseConsumer(ctx, "KV_s", name, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		paused++
	}
	if paused != 1 {
		t.Fatalf("%d consumers, want the watch's one", paused)
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 15*time.Second, func() bool { _, ok := v.get("k"); return ok }, "the change through a new consumer")
}
