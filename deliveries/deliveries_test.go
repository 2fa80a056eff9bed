package deliveries_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/chime-nats/chime/deliveries"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/subjects"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// store publishes one envelope with text into agentID's inbox.
func store(t *testing.T, js jetstream.JetStream, agentID, text string) uint64 {
	t.Helper()
	b, _ := json.Marshal(subjects.Envelope{ID: text, AgentID: agentID, Kind: subjects.KindMessage, Text: text})
	ack, err := js.Publish(context.Background(), subjects.Inbox(agentID), b)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// reader starts a provisioned server and returns a Reader of its inbox
// stream.
func reader(t *testing.T) (jetstream.JetStream, *deliveries.Reader) {
	t.Helper()
	nc, _ := natstest.Provisioned(t, natstest.Server(t))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js, deliveries.NewReader(js, engine.InboxStream)
}

func texts(t *testing.T, list []deliveries.Delivery) []string {
	t.Helper()
	out := []string{}
	for _, d := range list {
		var env subjects.Envelope
		if err := json.Unmarshal(d.Envelope, &env); err != nil {
			t.Fatal(err)
		}
		out = append(out, env.Text)
	}
	return out
}

// TestRecent: an agent's last deliveries are found however far back among
// other agents' they are, newest first, and reading leaves no consumer.
func TestRecent(t *testing.T) {
	ns := natstest.Server(t)
	nc, _ := natstest.Provisioned(t, ns)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	r := deliveries.NewReader(js, engine.InboxStream)

	for i := range 5 {
		store(t, js, "sparse", fmt.Sprintf("s%d", i))
		for j := range 100 {
			store(t, js, "busy", fmt.Sprintf("b%d-%d", i, j))
		}
	}
	last := store(t, js, "busy", "last")
	for _, tc := range []struct {
		agent string
		n     int
		want  string
	}{
		{"sparse", 3, "[s4 s3 s2]"},
		{"sparse", 50, "[s4 s3 s2 s1 s0]"},
		{"busy", 2, "[last b4-99]"},
		{"nobody", 5, "[]"},
	} {
		page, err := r.Recent(ctx, tc.agent, tc.n)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(texts(t, page.Deliveries)); got != tc.want || page.LastSeq != last {
			t.Errorf("%s last %d: %s (last seq %d), want %s (%d)", tc.agent, tc.n, got, page.LastSeq, tc.want, last)
		}
	}
	st, _ := js.Stream(ctx, engine.InboxStream)
	if info, _ := st.Info(ctx); info.State.Consumers != 0 {
		t.Errorf("%d consumers left behind", info.State.Consumers)
	}
	agents, err := r.Agents(ctx)
	if err != nil || len(agents) != 2 || agents["sparse"] != 5 || agents["busy"] != 501 {
		t.Errorf("agents: %v %v", agents, err)
	}
}

// TestFollow: a follower yields the agent's deliveries after the sequence
// it resumes from, in order, in batches as large as asked, wakes with the
// next one published, and holds no consumer: a backlog of any size is
// read, and one resuming after the last it read misses nothing.
func TestFollow(t *testing.T) {
	js, r := reader(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	seen := store(t, js, "f", "seen")
	store(t, js, "other", "not mine")
	var backlog []string
	for i := range 300 {
		backlog = append(backlog, fmt.Sprint("b", i))
		store(t, js, "f", backlog[i])
	}
	f, err := r.Follow(ctx, "f", seen)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []deliveries.Delivery
	for len(got) < 300 {
		list, err := f.Next(ctx, 64)
		if err != nil || len(list) > 64 {
			t.Fatalf("next: %d %v", len(list), err)
		}
		got = append(got, list...)
	}
	if fmt.Sprint(texts(t, got)) != fmt.Sprint(backlog) || f.After() != got[299].Seq {
		t.Fatalf("backlog: %v, after %d", texts(t, got), f.After())
	}
	st, _ := js.Stream(ctx, engine.InboxStream)
	if info, _ := st.Info(ctx); info.State.Consumers != 0 {
		t.Errorf("a follower holds %d consumers", info.State.Consumers)
	}

	// Woken by the next delivery, not a poll.
	go func() {
		time.Sleep(100 * time.Millisecond)
		store(t, js, "f", "late")
	}()
	start := time.Now()
	list, err := f.Next(ctx, 64)
	if err != nil || fmt.Sprint(texts(t, list)) != "[late]" {
		t.Fatalf("the next one: %v %v", list, err)
	}
	t.Logf("woken %v after the wait began", time.Since(start))

	// Nothing more: Next waits until its context ends.
	short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
	defer stop()
	if list, err := f.Next(short, 64); err != context.DeadlineExceeded || len(list) != 0 {
		t.Fatalf("with nothing more: %v %v", list, err)
	}

	// Resumed after the last read: the rest, and nothing twice.
	store(t, js, "f", "after the resume")
	again, err := r.Follow(ctx, "f", got[149].Seq)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	var rest []deliveries.Delivery
	for len(rest) < 152 {
		list, err := again.Next(ctx, 256)
		if err != nil {
			t.Fatal(err)
		}
		rest = append(rest, list...)
	}
	want := append(append(append([]string{}, backlog[150:]...), "late"), "after the resume")
	if fmt.Sprint(texts(t, rest)) != fmt.Sprint(want) {
		t.Fatalf("resumed: %v", texts(t, rest))
	}
}

// TestRecentFrom: a source's last deliveries are found among the agent's
// others and other agents', newest first, back to the stream's start or as
// far as the scan goes, and reading leaves no consumer.
func TestRecentFrom(t *testing.T) {
	ns := natstest.Server(t)
	nc, _ := natstest.Provisioned(t, ns)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	r := deliveries.NewReader(js, engine.InboxStream)

	from := func(agentID, srcID, text string) {
		t.Helper()
		b, _ := json.Marshal(subjects.Envelope{ID: text, AgentID: agentID, Kind: subjects.KindMonitorEvent, Text: text,
			Source: subjects.Source{Type: "monitor", ID: srcID}})
		if _, err := js.Publish(ctx, subjects.Inbox(agentID), b); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		from("a", "quiet", fmt.Sprintf("q%d", i))
		for j := range 300 {
			from("a", "loud", fmt.Sprintf("l%d-%d", i, j))
			store(t, js, "other", fmt.Sprintf("o%d-%d", i, j))
		}
		from("other", "quiet", fmt.Sprintf("not a's %d", i))
	}
	last := store(t, js, "a", "last")
	quiet := subjects.Source{Type: "monitor", ID: "quiet"}
	for _, tc := range []struct {
		agent   string
		src     subjects.Source
		n, scan int
		want    string
	}{
		{"a", quiet, 2, 10000, "[q2 q1]"},
		{"a", quiet, 50, 10000, "[q2 q1 q0]"},
		{"a", quiet, 50, 700, "[q2 q1]"}, // q0 is 904 deliveries back
		{"a", quiet, 50, 302, "[q2]"},    // q2 is 302
		{"a", quiet, 50, 301, "[]"},
		{"a", subjects.Source{Type: "monitor", ID: "loud"}, 2, 10000, "[l2-299 l2-298]"},
		{"a", subjects.Source{Type: "task", ID: "quiet"}, 5, 10000, "[]"},
		{"other", quiet, 5, 10000, "[not a's 2 not a's 1 not a's 0]"},
		{"nobody", quiet, 5, 10000, "[]"},
	} {
		page, err := r.RecentFrom(ctx, tc.agent, tc.src, tc.n, tc.scan)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(texts(t, page.Deliveries)); got != tc.want || page.LastSeq != last {
			t.Errorf("%s %v last %d of %d: %s (last seq %d), want %s (%d)", tc.agent, tc.src, tc.n, tc.scan, got, page.LastSeq, tc.want, last)
		}
	}
	st, _ := js.Stream(ctx, engine.InboxStream)
	if info, _ := st.Info(ctx); info.State.Consumers != 0 {
		t.Errorf("%d consumers left behind", info.State.Consumers)
	}
}
