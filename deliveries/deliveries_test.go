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

// TestFollow: a feed yields the agent's deliveries after the sequence it
// resumes from, in order, and ends when its reader falls behind.
func TestFollow(t *testing.T) {
	js, r := reader(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	seen := store(t, js, "f", "seen")
	store(t, js, "other", "not mine")
	feed, err := r.Follow(ctx, "f", seen, 16)
	if err != nil {
		t.Fatal(err)
	}
	store(t, js, "f", "one")
	store(t, js, "f", "two")
	var got []deliveries.Delivery
	for len(got) < 2 {
		select {
		case d := <-feed.C():
			got = append(got, d)
		case <-time.After(10 * time.Second):
			t.Fatal("no delivery")
		}
	}
	if fmt.Sprint(texts(t, got)) != "[one two]" || got[0].Seq <= seen || got[1].Seq <= got[0].Seq {
		t.Fatalf("feed: %+v", got)
	}

	slow, err := r.Follow(ctx, "f", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		store(t, js, "f", fmt.Sprint("burst", i))
	}
	// Nothing is read: the second delivery finds the buffer full.
	for deadline := time.Now().Add(10 * time.Second); slow.Err() == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a reader behind is still fed")
		}
	}
	if slow.Err() != deliveries.ErrBehind {
		t.Fatalf("a reader behind: %v", slow.Err())
	}
	for range slow.C() { // what it had is still there, then the end
	}
	cancel()
	for range feed.C() {
	}
	if feed.Err() != nil {
		t.Fatalf("a feed whose context ended: %v", feed.Err())
	}
}

// TestFollowBehindAtStart: a feed that resumes with more waiting than its
// buffer holds falls behind in its first callbacks, before Follow has
// returned: it ends with ErrBehind (under -race: with no race on its
// consumer, and no panic on a consumer not yet set).
func TestFollowBehindAtStart(t *testing.T) {
	js, r := reader(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	first := store(t, js, "resume", "first")
	for i := range 300 {
		store(t, js, "resume", fmt.Sprint("waiting", i))
	}
	for range 20 { // the race is at the feed's start: start many
		feed, err := r.Follow(ctx, "resume", first, 256)
		if err != nil {
			t.Fatal(err)
		}
		// Nothing is read until the feed ends. Its buffer filling is
		// watched with len, which orders nothing, so that the race
		// detector sees the feed's start as it runs.
		for deadline := time.Now().Add(10 * time.Second); len(feed.C()) < cap(feed.C()); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the feed's buffer never fills")
			}
		}
		for deadline := time.Now().Add(10 * time.Second); feed.Err() == nil; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("a reader behind is still fed")
			}
		}
		n := 0
		for range feed.C() {
			n++
		}
		if feed.Err() != deliveries.ErrBehind || n != 256 {
			t.Fatalf("a feed resumed with 300 waiting: %v after %d", feed.Err(), n)
		}
	}
}
