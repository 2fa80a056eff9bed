package waitfor

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// TestRegistrationRacesWake: envelopes of agents with no registration
// are passed over unread while a recent catch-up vouches for the view
// (Absent); a registration whose wake is stored just after it returns is
// woken all the same, by a consumer whose view applies each index change
// late (another replica's, lagging less than the window, so that it still
// vouches). The registration waits out the window before its catch-up:
// without that wait the consumer passes such wakes over.
func TestRegistrationRacesWake(t *testing.T) {
	ns := natstest.Server(t)
	_, res := natstest.Provisioned(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	store := NewStore(res.WaitFor, nil, kvrec.Retention{})
	inbox := consumer.NewInbox(res.JS, engine.InboxStream, time.Minute, nil)
	svc := NewService(Config{
		Store: store, Timers: timers.NewStore(res.Timers, nil, kvrec.Retention{}), Inbox: inbox, JS: res.JS,
		InboxStream: engine.InboxStream, EventsStream: engine.EventsStream,
	})
	ix := newIndex(res.JS, engine.WaitForBucket, nil, presenceWindow*2/3)
	if err := ix.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer ix.Stop(context.Background())
	c := NewConsumer(ConsumerConfig{JS: res.JS, Service: svc, Store: store, Index: ix,
		InboxStream: engine.InboxStream, WaitForStream: engine.WaitForStream})
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(context.Background())

	hint := func(agentID, id string) {
		env := &subjects.Envelope{ID: id, AgentID: agentID, Kind: subjects.KindWakeHint, At: time.Now(), Trust: subjects.TrustExternal}
		if _, err := inbox.Deliver(ctx, env); err != nil {
			t.Error(err)
		}
	}
	// Wakes of agents with no registration, steadily: the view keeps
	// vouching, and they are passed over.
	noise, stopNoise := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; noise.Err() == nil; i++ {
			hint(fmt.Sprint("idle-", i%50), fmt.Sprint("noise-", i))
			time.Sleep(2 * time.Millisecond)
		}
	})
	defer func() { stopNoise(); wg.Wait() }()
	testwait.Eventually(t, 5*time.Second, func() bool { return ix.Absent("idle-0") }, "the view vouching for an agent with no registration")

	spec, err := DecodeWaitFor([]byte(`{"wake":"external","reason":"ci","delivery":"silent"}`))
	if err != nil {
		t.Fatal(err)
	}
	const agents = 20
	ids := make([]string, agents)
	for i := range agents {
		agentID := fmt.Sprint("racer-", i)
		reply, err := svc.WaitFor(ctx, agentID, spec)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = reply.WaitID
		hint(agentID, fmt.Sprint("wake-", i)) // stored after the registration's catch-up
	}
	for i, id := range ids {
		agentID := fmt.Sprint("racer-", i)
		testwait.Until(t, 15*time.Second, func() (bool, string) {
			w, err := store.Get(ctx, agentID, id)
			if err != nil {
				t.Fatal(err)
			}
			return w.Status == WaitForWoken, string(w.Status)
		}, "%s's registration woken by the wake stored after it", agentID)
	}
}
