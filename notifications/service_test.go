package notifications

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testwait"
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
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
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
		item, err := s.Notify(ctx, "ann", &Notification{Message: fmt.Sprintf("m%d", i), Type: NotifyInfo})
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
	testwait.Until(t, 5*time.Second, func() (bool, string) {
		n := keys()
		return n <= 3*limit, fmt.Sprintf("%d keys of ann (live and markers) kept", n)
	}, "ann compacted to its limit %d", limit)
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
		svc.compactLater("ann")
		stopped := make(chan struct{})
		go func() {
			svc.Stop(context.Background())
			svc.Stop(context.Background())
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Fatal("Stop did not return")
		}
	}
}

// TestResumeOnAReplicaBehind: a client resuming after sequence N on
// another replica (one started after the changes) gets no change at or
// below N, neither replayed nor live: it never sees a notification go
// back to an older state.
func TestResumeOnAReplicaBehind(t *testing.T) {
	a, js := start(t, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var since uint64
	for i := range 5 {
		item, err := a.Notify(ctx, "ann", &Notification{ID: "n", Message: fmt.Sprintf("v%d", i), Type: NotifyInfo})
		if err != nil {
			t.Fatal(err)
		}
		since = item.Seq
	}
	b := New(Config{JS: js, KV: a.kv, Max: 10})
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	f, err := b.Follow(ctx, "", &since)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Notify(ctx, "ann", &Notification{ID: "n", Message: "v5", Type: NotifyInfo}); err != nil {
		t.Fatal(err)
	}
	for _, ev := range f.Replay {
		t.Errorf("replayed seq %d, at or below the resume point %d", ev.Seq, since)
	}
	// The first change must be the one after the resume point.
	if ev, ok := <-f.C; !ok || ev.Seq <= since {
		t.Fatalf("live seq %d (open %v), at or below the resume point %d", ev.Seq, ok, since)
	}
}

// TestAnswersFromTheStore: a replica that has loaded nothing (never
// started) answers histories, the agent list and mark-read from the
// bucket at once, with what another replica wrote.
func TestAnswersFromTheStore(t *testing.T) {
	a, js := start(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ids []string
	for i := range 5 {
		item, err := a.Notify(ctx, "ann", &Notification{Message: fmt.Sprintf("m%d", i), Type: NotifyInfo, Detail: "<p>d</p>"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, item.ID)
	}
	b := New(Config{JS: js, KV: a.kv, Max: 3, SanitizeDetail: func(s string) string { return "safe:" + s }})
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	qctx, qcancel := context.WithTimeout(ctx, 2*time.Second)
	defer qcancel()
	h, err := b.List(qctx, "ann", nil)
	if err != nil {
		t.Fatal(err)
	}
	if h.Count != 3 || h.Notifications[0].ID != ids[2] || h.Notifications[2].ID != ids[4] || h.Notifications[0].DetailHTML != "safe:<p>d</p>" {
		t.Fatalf("history read by a replica that loaded nothing: %+v", h)
	}
	// The evictions' markers: a reader from the first notification is
	// told which went.
	first := h.Notifications[0].Seq - 3
	since, err := b.List(qctx, "ann", &first)
	if err != nil {
		t.Fatal(err)
	}
	if since.Cleared || len(since.Removed) == 0 || since.Seq != h.Seq {
		t.Fatalf("since %d: %+v", first, since)
	}
	agents, err := b.Agents(qctx)
	if err != nil {
		t.Fatal(err)
	}
	if agents["ann"] != (Counts{Total: 3, Unread: 3}) {
		t.Fatalf("agents: %+v", agents)
	}
	if n, err := b.MarkRead(qctx, "ann", []string{ids[3], "nope"}, false); err != nil || n != 1 {
		t.Fatalf("mark read: %d, %v", n, err)
	}
	if agents, err := a.Agents(qctx); err != nil || agents["ann"] != (Counts{Total: 3, Unread: 2}) {
		t.Fatalf("agents after a mark-read: %+v, %v", agents, err)
	}
}

// BenchmarkList reads one agent's whole history of 100 notifications with
// 8 KiB details from the store (the bucket also holds 50 other agents').
func BenchmarkList(b *testing.B) {
	nc, res := natstest.Provisioned(b, natstest.Server(b))
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	s := New(Config{JS: js, KV: res.Notifications, Max: 100})
	if err := s.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Stop(context.Background()) })
	ctx := context.Background()
	detail := strings.Repeat("<p>The <b>build</b> finished.</p>", 8192/33)
	for a := range 51 {
		for i := range 100 {
			if _, err := s.Notify(ctx, fmt.Sprintf("agent%d", a), &Notification{Message: fmt.Sprint(i), Detail: detail, Type: NotifyInfo}); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ResetTimer()
	for b.Loop() {
		h, err := s.List(ctx, "agent7", nil)
		if err != nil || h.Count != 100 {
			b.Fatalf("%d, %v", h.Count, err)
		}
	}
}
