package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
)

// A stream leader on the minority side of a partition never answers: the
// publish is sent again after an attempt's time, not held for the caller's
// whole deadline. The "stream" here is a responder that drops the first
// request, as a cut-off leader does, and acks the second.
func TestPublishRetriesAnUnansweredAttempt(t *testing.T) {
	ns := natstest.Server(t)
	js := natstest.JetStream(t, ns)
	nc := js.Conn()
	var asked atomic.Int32
	sub, err := nc.Subscribe("lost.leader", func(m *nats.Msg) {
		if asked.Add(1) == 1 {
			return
		}
		_ = m.Respond([]byte(`{"stream":"S","seq":7}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m := nats.NewMsg("lost.leader")
	m.Header.Set(jetstream.MsgIDHeader, "once")
	ack, err := consumer.Publish(ctx, js, m)
	if err != nil || ack.Sequence != 7 {
		t.Fatalf("publish: %v %+v", err, ack)
	}
	if n := asked.Load(); n != 2 {
		t.Fatalf("asked %d times, want 2", n)
	}
}

// A refusal by the stream is an answer: it is returned, not retried.
func TestPublishReturnsARefusal(t *testing.T) {
	ns := natstest.Server(t)
	js := natstest.JetStream(t, ns)
	nc := js.Conn()
	var asked atomic.Int32
	sub, err := nc.Subscribe("refusing", func(m *nats.Msg) {
		asked.Add(1)
		_ = m.Respond([]byte(`{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = consumer.Publish(ctx, js, nats.NewMsg("refusing"))
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10077 {
		t.Fatalf("publish: %v, want the stream's refusal", err)
	}
	if n := asked.Load(); n != 1 {
		t.Fatalf("asked %d times, want 1", n)
	}
}

// The caller's deadline bounds every attempt together; running out while
// nothing answers is the engine unavailable.
func TestPublishEndsWithItsContext(t *testing.T) {
	ns := natstest.Server(t)
	js := natstest.JetStream(t, ns)
	sub, err := js.Conn().Subscribe("silent", func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := consumer.Publish(ctx, js, nats.NewMsg("silent")); !errors.Is(err, kvrec.ErrUnavailable) {
		t.Fatalf("publish: %v, want unavailable", err)
	}
}
