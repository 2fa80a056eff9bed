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
	ns := natstest.Server(t)
	nc, _ := natstest.Provisioned(t, ns)
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := deliveries.NewReader(js, engine.InboxStream)

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
