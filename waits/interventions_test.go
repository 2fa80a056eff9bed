package waits_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/metrictest"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/interventions"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/waits"
)

// rig is one replica's waits components on a real server.
type rig struct {
	nc     *nats.Conn
	res    *engine.Resources
	agents *agents.Store
	store  *waits.Store
	reqs   *waits.Requests
	reg    *prometheus.Registry
}

func newRig(t *testing.T) *rig {
	t.Helper()
	ns := natstest.Server(t)
	nc, res := natstest.Provisioned(t, ns)
	r := &rig{nc: nc, res: res, agents: agents.NewStore(res.Agents), reg: prometheus.NewRegistry()}
	r.store = waits.NewStore(res.Waits, r.agents, nil, kvrec.Retention{})
	r.reqs = waits.NewRequests(r.store, consumer.NewInbox(res.JS, engine.InboxStream, 2*time.Minute, nil), res.JS, nil, nil)
	return r
}

// start runs the wait consumers until the test ends.
func (r *rig) start(t *testing.T) *waits.Consumer { t.Helper(); return r.startWith(t, r.reg) }

// startWith runs wait consumers registering their metrics with reg.
func (r *rig) startWith(t *testing.T, reg prometheus.Registerer) *waits.Consumer {
	t.Helper()
	c := waits.NewConsumer(waits.ConsumerConfig{
		JS: r.res.JS, Stream: engine.EventsStream, Store: r.store, Agents: r.agents,
		Inbox: consumer.NewInbox(r.res.JS, engine.InboxStream, 2*time.Minute, nil), Registerer: reg, Log: slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	return c
}

// inbox subscribes to an agent's inbox deliveries.
func (r *rig) inbox(t *testing.T, agentID string) chan *nats.Msg {
	t.Helper()
	ch := make(chan *nats.Msg, 64)
	sub, err := r.nc.ChanSubscribe(subjects.Inbox(agentID), ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return ch
}

func (r *rig) intervene(t *testing.T, agentID, action, text string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := r.reqs.Intervene(ctx, agentID, &interventions.InterventionRequest{Action: action, Text: text}); err != nil {
		t.Fatal(err)
	}
}

// inject stores an event on an agent's intervention subject directly.
func (r *rig) inject(t *testing.T, agentID string, data []byte) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ack, err := r.res.JS.Publish(ctx, subjects.InterventionApply(agentID), data)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

func (r *rig) counter(t *testing.T, name string, labels map[string]string) float64 {
	return metrictest.Counter(t, r.reg, name, labels)
}

// expect waits for the agent's intervention delivery with text.
func expect(t *testing.T, inbox chan *nats.Msg, text string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := time.After(within)
	for {
		select {
		case m := <-inbox:
			var env subjects.Envelope
			if err := json.Unmarshal(m.Data, &env); err != nil {
				t.Fatal(err)
			}
			if env.Kind == subjects.KindIntervention && env.Text == text {
				return time.Since(start)
			}
		case <-deadline:
			t.Fatalf("intervention %q not delivered within %v", text, within)
		}
	}
}

// TestInterventionTooLargeRefused: an intervention whose delivery cannot
// fit the max payload (though the request and the event would) is refused
// at the request with payload_too_large, and nothing is stored.
func TestInterventionTooLargeRefused(t *testing.T) {
	r := newRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	text := strings.Repeat("x", int(r.nc.MaxPayload())-180)
	_, err := r.reqs.Intervene(ctx, "big", &interventions.InterventionRequest{Action: interventions.ActionMessage, Text: text})
	var e *subjects.Error
	if !errors.As(err, &e) || e.Code != subjects.CodePayloadTooLarge || !strings.Contains(e.Message, "intervention text too large") {
		t.Fatalf("err = %v", err)
	}
	t.Logf("refused: %s", e.Message)
	stream, err := r.res.JS.Stream(ctx, engine.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.GetLastMsgForSubject(ctx, subjects.InterventionApply("big")); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("something was stored: %v", err)
	}
	// Half the limit is fine.
	if _, err := r.reqs.Intervene(ctx, "big", &interventions.InterventionRequest{Action: interventions.ActionMessage, Text: text[:len(text)/2]}); err != nil {
		t.Fatalf("half size: %v", err)
	}
}

// TestPoisonInterventionIsolated: one agent's undecodable, undeliverable
// and stuck interventions hold up no other agent's; the poison ones are
// terminated and counted, and the agent's own next one still arrives.
func TestPoisonInterventionIsolated(t *testing.T) {
	r := newRig(t)
	r.start(t)
	inboxA, inboxB := r.inbox(t, "agent-a"), r.inbox(t, "agent-b")

	// Undecodable, then an event that fits the stream but whose delivery
	// cannot fit the max payload (it got past the request check).
	r.inject(t, "agent-a", []byte("{not json"))
	big, _ := json.Marshal(interventions.Intervention{
		ID: "iv_big", AgentID: "agent-a", Action: interventions.ActionMessage, At: time.Now().UTC(),
		Text: strings.Repeat("x", int(r.nc.MaxPayload())-180),
	})
	r.inject(t, "agent-a", big)
	r.intervene(t, "agent-b", interventions.ActionMessage, "for b")
	t.Logf("b's intervention delivered %v after it was sent", expect(t, inboxB, "for b", 3*time.Second).Round(time.Millisecond))

	poison := map[string]string{"consumer": waits.InterventionsDurable, "reason": consumer.ReasonPoison}
	testwait.Until(t, 3*time.Second, func() (bool, string) {
		n := r.counter(t, "chime_consumer_terminated_total", poison)
		return n == 2, fmt.Sprint(n)
	}, "2 poison terminated")
	r.intervene(t, "agent-a", interventions.ActionMessage, "for a")
	expect(t, inboxA, "for a", 3*time.Second)

	// Agent c's intervention keeps failing (a corrupt wait record breaks
	// the listing of its waits): it is retried, and b is not held up.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := r.res.Waits.KVs[0].Put(ctx, "agent-c.broken", []byte("{corrupt")); err != nil {
		t.Fatal(err)
	}
	r.intervene(t, "agent-c", interventions.ActionStop, "stop c")
	r.intervene(t, "agent-b", interventions.ActionMessage, "again for b")
	expect(t, inboxB, "again for b", 3*time.Second)
	for r.counter(t, "chime_wait_event_failures_total", nil) < 1 {
		select {
		case <-ctx.Done():
			t.Fatal("c's intervention did not fail")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestPauseResumeInOrder: pauses and resumes sent back to back, for
// several agents at once, apply in the order sent though many workers
// run: each agent ends as its last intervention left it (resumed, or
// paused for the odd ones), in its record and its waits' records.
func TestPauseResumeInOrder(t *testing.T) {
	r := newRig(t)
	r.start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	const agentsN, rounds = 6, 3
	var ids []string
	for i := range agentsN {
		id := fmt.Sprintf("ord-%d", i)
		ids = append(ids, id)
		for range 3 {
			if _, err := r.store.Create(ctx, id, &waits.WaitSpec{Mode: waits.WaitDuration, Target: time.Now().Add(time.Hour)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	start := time.Now()
	for range rounds {
		for _, id := range ids {
			r.intervene(t, id, interventions.ActionPause, "")
			r.intervene(t, id, interventions.ActionResume, "")
		}
	}
	for i, id := range ids {
		if i%2 == 1 {
			r.intervene(t, id, interventions.ActionPause, "")
		}
	}
	stream, err := r.res.JS.Stream(ctx, engine.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		last, err := stream.GetLastMsgForSubject(ctx, subjects.InterventionApply(id))
		if err != nil {
			t.Fatal(err)
		}
		var st *agents.AgentState
		for {
			if st, _, err = r.agents.Get(ctx, id); err != nil {
				t.Fatal(err)
			}
			if st.LastInterventionSeq == last.Sequence {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s: applied through %d, last is %d", id, st.LastInterventionSeq, last.Sequence)
			case <-time.After(20 * time.Millisecond):
			}
		}
		paused := i%2 == 1
		if (st.PausedAt != nil) != paused {
			t.Errorf("%s: agent paused_at %v, want paused %v", id, st.PausedAt, paused)
		}
		all, err := r.store.List(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range all {
			if (w.PausedAt != nil) != paused || w.Status != waits.WaitWaiting {
				t.Errorf("%s: wait %s paused_at %v status %s, want paused %v", id, w.ID, w.PausedAt, w.Status, paused)
			}
		}
	}
	t.Logf("%d agents x %d pause/resume pairs applied in order in %v", agentsN, rounds, time.Since(start).Round(time.Millisecond))
}

// TestGivenUpInterventionSteppedPast: an intervention the consumer gave
// up on without recording it (terminated elsewhere) does not hold up the
// agent's next one.
func TestGivenUpInterventionSteppedPast(t *testing.T) {
	r := newRig(t)
	first := r.startWith(t, nil) // creates the durable
	first.Stop(context.Background())
	inbox := r.inbox(t, "lost")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r.intervene(t, "lost", interventions.ActionMessage, "given up")
	cons, err := r.res.JS.Consumer(ctx, engine.EventsStream, waits.InterventionsDurable)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil { // as if applied, but never recorded
			t.Fatal(err)
		}
	}
	r.intervene(t, "lost", interventions.ActionMessage, "next")
	r.start(t)
	expect(t, inbox, "next", 3*time.Second)
	if n := r.counter(t, "chime_interventions_skipped_total", nil); n != 1 {
		t.Errorf("skipped = %v", n)
	}
}

// TestInterventionSparesLaterWaits: an intervention is applied after its
// reply, so an agent that waits again at once must not have the new wait
// cancelled by the intervention it has already been told of; the waits
// in flight when it was made end.
func TestInterventionSparesLaterWaits(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	before, err := r.store.Create(ctx, "a1", &waits.WaitSpec{Mode: waits.WaitDuration, Target: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	inbox := r.inbox(t, "a1")
	r.intervene(t, "a1", interventions.ActionMessage, "stop what you are doing")
	time.Sleep(5 * time.Millisecond) // the next wait is created after the intervention's time, as after its reply
	after, err := r.store.Create(ctx, "a1", &waits.WaitSpec{Mode: waits.WaitDuration, Target: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	r.start(t) // applied only now
	expect(t, inbox, "stop what you are doing", 10*time.Second)
	if got, err := r.store.Get(ctx, "a1", before.ID); err != nil || got.Status != waits.WaitCancelled {
		t.Fatalf("the wait in flight: %+v %v", got, err)
	}
	if got, err := r.store.Get(ctx, "a1", after.ID); err != nil || got.Status != waits.WaitWaiting {
		t.Fatalf("the wait after the intervention: %+v %v", got, err)
	}
}
