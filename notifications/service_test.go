package notifications

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/subjects"
)

// start runs a Service with limit max on its own JetStream server.
func start(t *testing.T, max int) (*Service, jetstream.JetStream) {
	t.Helper()
	nc, res := natstest.Provisioned(t, natstest.Server(t))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s := New(Config{JS: js, KV: res.Notifications, Max: max})
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	select {
	case <-s.Loaded():
	case <-time.After(10 * time.Second):
		t.Fatal("view not loaded")
	}
	return s, js
}

// TestCompactionOffTheReplyPath: each notify returns with exactly the
// limit kept; the removal markers it leaves are compacted afterwards, in
// the background, and a reader from before them is then told to replace
// its list.
func TestCompactionOffTheReplyPath(t *testing.T) {
	const limit = 3
	s, js := start(t, limit)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var first uint64
	for i := range 10 * limit {
		item, err := s.Notify(ctx, "ann", &subjects.Notification{Message: fmt.Sprintf("m%d", i), Type: subjects.NotifyInfo})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = item.Seq
		}
		h, err := s.List(ctx, "ann", nil)
		if err != nil {
			t.Fatal(err)
		}
		if h.Count != min(i+1, limit) {
			t.Fatalf("after notify %d: %d kept, limit %d", i, h.Count, limit)
		}
	}
	st, err := js.Stream(ctx, s.stream)
	if err != nil {
		t.Fatal(err)
	}
	keys := func() int {
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(s.prefix+"ann.*"))
		if err != nil {
			t.Fatal(err)
		}
		return len(info.State.Subjects)
	}
	deadline := time.Now().Add(5 * time.Second)
	for n := keys(); n > 3*limit; n = keys() {
		if time.Now().After(deadline) {
			t.Fatalf("%d keys of ann (live and markers) kept, limit %d: not compacted", n, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
	h, err := s.List(ctx, "ann", &first)
	if err != nil {
		t.Fatal(err)
	}
	if !h.Cleared || h.Count != limit {
		t.Fatalf("a reader from %d, before the compacted removals: %+v", first, h)
	}
}

// TestStopWithCompactionDue: Stop returns with compactions due, before
// Start, and twice.
func TestStopWithCompactionDue(t *testing.T) {
	s, _ := start(t, 1)
	idle := New(Config{JS: s.js, KV: s.kv})
	for _, svc := range []*Service{s, idle} {
		svc.compactLater("ann", 1<<40) // a marker the view never gets to
		stopped := make(chan struct{})
		go func() {
			svc.Stop()
			svc.Stop()
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Fatal("Stop did not return")
		}
	}
}

// TestResumeOnAReplicaBehind: a client resuming after sequence N on a
// replica whose view has not reached N yet gets no change at or below N,
// neither replayed nor live as the view catches up: it never sees a
// notification go back to an older state.
func TestResumeOnAReplicaBehind(t *testing.T) {
	a, js := start(t, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var since uint64
	for i := range 5 {
		item, err := a.Notify(ctx, "ann", &subjects.Notification{ID: "n", Message: fmt.Sprintf("v%d", i), Type: subjects.NotifyInfo})
		if err != nil {
			t.Fatal(err)
		}
		since = item.Seq
	}
	// b is a second replica whose view starts only after the client came.
	b := New(Config{JS: js, KV: a.kv, Max: 10})
	t.Cleanup(b.Stop)
	type followed struct {
		feed *Feed
		err  error
	}
	got := make(chan followed, 1)
	go func() {
		f, err := b.Follow(ctx, "", &since)
		got <- followed{f, err}
	}()
	// Let a Follow that does not wait subscribe before the view loads (it
	// would then be sent the loading changes live); one that waits for
	// the view does not subscribe yet.
	subscribed := func() bool {
		b.idx.mu.Lock()
		defer b.idx.mu.Unlock()
		return len(b.idx.feeds) > 0
	}
	for deadline := time.Now().Add(200 * time.Millisecond); !subscribed() && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	f := <-got
	if f.err != nil {
		t.Fatal(f.err)
	}
	defer f.feed.Close()
	<-b.Loaded() // before the next change, which would supersede the last one in the load
	if _, err := a.Notify(ctx, "ann", &subjects.Notification{ID: "n", Message: "v5", Type: subjects.NotifyInfo}); err != nil {
		t.Fatal(err)
	}
	for _, ev := range f.feed.Replay {
		t.Errorf("replayed seq %d, at or below the resume point %d", ev.Seq, since)
	}
	// The first live change must be the one after the resume point.
	if ev, ok := <-f.feed.C; !ok || ev.Seq <= since {
		t.Fatalf("live seq %d (open %v), at or below the resume point %d", ev.Seq, ok, since)
	}
}
