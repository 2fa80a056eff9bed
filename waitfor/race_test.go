package waitfor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waitfor"
)

// TestReplicasRaceOnWakes: two replicas' services, ten wakes at once, each
// applied by both (as redeliveries and a shared consumer would): one
// wake wins, its cause is the one delivered, and one wait_woken is stored.
func TestReplicasRaceOnWakes(t *testing.T) {
	ns := natstest.Server(t)
	_, res := natstest.Provisioned(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	service := func() *waitfor.Service {
		return waitfor.NewService(waitfor.Config{
			Store:  waitfor.NewStore(res.WaitFor, nil, kvrec.Retention{}),
			Timers: timers.NewStore(res.Timers, nil, kvrec.Retention{}),
			Inbox:  consumer.NewInbox(res.JS, engine.InboxStream, time.Minute, nil), JS: res.JS,
			InboxStream: engine.InboxStream, EventsStream: engine.EventsStream,
		})
	}
	a, b := service(), service()
	spec, err := waitfor.DecodeWaitFor([]byte(`{"wake":"external","reason":"ci","delivery":"silent"}`))
	if err != nil {
		t.Fatal(err)
	}
	reply, err := a.WaitFor(ctx, "racer", spec)
	if err != nil {
		t.Fatal(err)
	}
	w, err := waitfor.NewStore(res.WaitFor, nil, kvrec.Retention{}).Get(ctx, "racer", reply.WaitID)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 10 {
		env := subjects.Envelope{ID: fmt.Sprintf("hint-%d", i), AgentID: "racer", Kind: subjects.KindWakeHint, At: time.Now(), Trust: subjects.TrustExternal}
		for _, s := range []*waitfor.Service{a, b} {
			wg.Go(func() {
				if err := s.Apply(ctx, w, &env, w.SinceSeq+uint64(i)+1); err != nil {
					t.Error(err)
				}
			})
		}
	}
	wg.Wait()
	got, err := waitfor.NewStore(res.WaitFor, nil, kvrec.Retention{}).Get(ctx, "racer", reply.WaitID)
	if err != nil || got.Status != waitfor.WaitForWoken || got.WokenBy == nil {
		t.Fatalf("after the race: %+v %v", got, err)
	}
	cons, err := res.JS.OrderedConsumer(ctx, engine.InboxStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subjects.Inbox("racer")}})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.FetchNoWait(100)
	if err != nil {
		t.Fatal(err)
	}
	var woken []waitfor.WaitWokenData
	for m := range batch.Messages() {
		var env subjects.Envelope
		if err := json.Unmarshal(m.Data(), &env); err != nil {
			t.Fatal(err)
		}
		if env.Kind == subjects.KindWaitWoken {
			var d waitfor.WaitWokenData
			if err := json.Unmarshal(env.Data, &d); err != nil {
				t.Fatal(err)
			}
			woken = append(woken, d)
		}
	}
	if len(woken) != 1 || woken[0].WokenBy.EnvelopeID != got.WokenBy.EnvelopeID {
		t.Fatalf("wait_woken stored %d times (%+v); the record says woken by %s", len(woken), woken, got.WokenBy.EnvelopeID)
	}
}
