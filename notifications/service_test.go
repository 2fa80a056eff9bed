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
