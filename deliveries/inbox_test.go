package deliveries_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/deliveries"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/subjects"
)

// inbox starts a provisioned server and returns the agents' inbox reads
// over it.
func inbox(t testing.TB) (jetstream.JetStream, *deliveries.Inbox) {
	t.Helper()
	nc, res := natstest.Provisioned(t, natstest.Server(t))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js, deliveries.NewInbox(deliveries.NewReader(js, engine.InboxStream), agents.NewStore(res.Agents))
}

// BenchmarkInboxFetch: one fetch of an agent's 64 deliveries, interleaved
// with 15 other agents' (the cost the agent's read pays per fetch).
func BenchmarkInboxFetch(b *testing.B) {
	js, in := inbox(b)
	ctx := context.Background()
	for i := range 64 * 16 {
		agent := fmt.Sprintf("a%d", i%16)
		env, _ := json.Marshal(subjects.Envelope{ID: fmt.Sprint(i), AgentID: agent, Kind: subjects.KindMessage, Text: "some text of an ordinary length for a delivery"})
		if _, err := js.Publish(ctx, subjects.Inbox(agent), env); err != nil {
			b.Fatal(err)
		}
	}
	for _, max := range []int{1, 16, 64} {
		b.Run(fmt.Sprint("max=", max), func(b *testing.B) {
			req := &deliveries.InboxFetch{Max: max}
			for b.Loop() {
				r, err := in.Fetch(ctx, "a3", req)
				if err != nil || len(r.Deliveries) != max {
					b.Fatalf("%d deliveries, %v", len(r.Deliveries), err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(max), "ns/delivery")
		})
	}
}

// publish stores an envelope of text for agentID and returns its sequence.
func publish(t testing.TB, js jetstream.JetStream, agentID, id, text string) uint64 {
	t.Helper()
	env, _ := json.Marshal(subjects.Envelope{ID: id, AgentID: agentID, Kind: subjects.KindMessage, Text: text})
	ack, err := js.Publish(context.Background(), subjects.Inbox(agentID), env)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// TestFetchOneRequest: a fetch reads its deliveries in one request to the
// server, however many it returns, and in order, skipping other agents';
// on a stream without direct gets (made by an older chime) it still reads
// them all, one get each.
func TestFetchOneRequest(t *testing.T) {
	ns := natstest.Server(t)
	_, res := natstest.Provisioned(t, ns)
	// The reader on a connection of its own, whose messages out are its gets.
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	in := deliveries.NewInbox(deliveries.NewReader(js, engine.InboxStream), agents.NewStore(res.Agents))
	ctx := context.Background()
	var mine []uint64
	for i := range 40 {
		publish(t, js, "other", fmt.Sprint("o", i), "not mine")
		mine = append(mine, publish(t, js, "me", fmt.Sprint("m", i), "mine"))
	}
	seqs := func(r *deliveries.InboxFetchReply) []uint64 {
		out := []uint64{}
		for _, d := range r.Deliveries {
			out = append(out, d.Seq)
		}
		return out
	}
	out := nc.Stats().OutMsgs
	r, err := in.Fetch(ctx, "me", &deliveries.InboxFetch{Max: 32})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(seqs(r)), fmt.Sprint(mine[:32]); got != want {
		t.Fatalf("fetched %s, want %s", got, want)
	}
	if n := nc.Stats().OutMsgs - out; n != 1 {
		t.Fatalf("a fetch of 32 sent %d requests, want 1", n)
	}
	after := mine[29]
	if r, err = in.Fetch(ctx, "me", &deliveries.InboxFetch{Max: 64, After: &after}); err != nil || fmt.Sprint(seqs(r)) != fmt.Sprint(mine[30:]) {
		t.Fatalf("after %d: %v %v, want %v", after, seqs(r), err, mine[30:])
	}
	last := mine[39]
	if r, err = in.Fetch(ctx, "me", &deliveries.InboxFetch{Max: 64, After: &last}); err != nil || len(r.Deliveries) != 0 {
		t.Fatalf("after the last: %v %v", seqs(r), err)
	}

	st, err := js.Stream(ctx, engine.InboxStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.AllowDirect = false
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if r, err = in.Fetch(ctx, "me", &deliveries.InboxFetch{Max: 64}); err != nil || fmt.Sprint(seqs(r)) != fmt.Sprint(mine) {
		t.Fatalf("without direct gets: %v %v, want %v", seqs(r), err, mine)
	}
}

// TestFetchFitsMaxPayload: a fetch returns what fits the server's max
// payload in its reply (the first delivery always), and the rest at the
// next fetch: a reply too large would never reach the agent, and it would
// ask for the same again for ever.
func TestFetchFitsMaxPayload(t *testing.T) {
	js, in := inbox(t)
	ctx := context.Background()
	maxPayload := int(js.Conn().MaxPayload())
	// Each a third of the max payload, and escaped larger in a reply.
	text := strings.Repeat("<", maxPayload/3/6) + strings.Repeat("x", maxPayload/3-maxPayload/3/6)
	for i := range 5 {
		publish(t, js, "big", fmt.Sprint("b", i), text)
	}
	var got []uint64
	for after, rounds := uint64(0), 0; len(got) < 5; rounds++ {
		if rounds == 5 {
			t.Fatalf("5 fetches read %v", got)
		}
		r, err := in.Fetch(ctx, "big", &deliveries.InboxFetch{Max: 64, After: &after})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(r)
		if len(b) > maxPayload || len(r.Deliveries) == 0 {
			t.Fatalf("a reply of %d deliveries, %d bytes: max payload %d", len(r.Deliveries), len(b), maxPayload)
		}
		for _, d := range r.Deliveries {
			got = append(got, d.Seq)
			after = d.Seq
		}
	}
}
