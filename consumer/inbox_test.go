package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/subjects"
)

// TestDeliverOnceBeyondTheWindow: an envelope whose first send is older
// than the dedup window is looked up in the inbox before it is published
// again; found, it is reported as a duplicate and not stored twice.
func TestDeliverOnceBeyondTheWindow(t *testing.T) {
	ns := natstest.Server(t)
	_, res := natstest.Provisioned(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now := time.Now()
	clock := func() time.Time { return now }
	inbox := consumer.NewInbox(res.JS, engine.InboxStream, time.Minute, clock)
	env := func(id string) *subjects.Envelope {
		return &subjects.Envelope{ID: id, AgentID: "once", Kind: subjects.KindTimerFired, At: now, Trust: subjects.TrustSystem}
	}
	sent := now
	for _, id := range []string{"e1", "e2", "e3"} {
		if ack, err := inbox.Deliver(ctx, env(id)); err != nil || ack.Duplicate {
			t.Fatalf("deliver %s: %v %+v", id, err, ack)
		}
	}
	if inbox.Suspect(sent) {
		t.Fatal("a fresh envelope is suspect")
	}
	// Two minutes later the stream's window (2 min in natstest) may have
	// forgotten it: look it up.
	now = now.Add(2 * time.Minute)
	if !inbox.Suspect(sent) {
		t.Fatal("an envelope older than the window is not suspect")
	}
	ack, err := inbox.DeliverOnce(ctx, env("e2"), sent)
	if err != nil || !ack.Duplicate {
		t.Fatalf("e2 again: %v %+v", err, ack)
	}
	ack, err = inbox.DeliverOnce(ctx, env("e4"), sent)
	if err != nil || ack.Duplicate {
		t.Fatalf("e4 (never sent): %v %+v", err, ack)
	}
	seen, err := inbox.Delivered(ctx, "once", sent)
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 4 || seen["e1"] == 0 || seen["e4"] <= seen["e1"] {
		t.Fatalf("delivered %v", seen)
	}
	if none, err := inbox.Delivered(ctx, "nobody", sent); err != nil || len(none) != 0 {
		t.Fatalf("empty inbox: %v %v", none, err)
	}
}
