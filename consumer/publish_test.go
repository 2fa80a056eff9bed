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

// fakeStream answers publishes to subject in place of a stream: answer
// gets the request's number (1 for the first) and returns the reply, or
// nil to leave it unanswered. It returns how many requests came.
func fakeStream(t *testing.T, subject string, answer func(n int32) []byte) (jetstream.JetStream, *atomic.Int32) {
	t.Helper()
	js := natstest.JetStream(t, natstest.Server(t))
	var asked atomic.Int32
	sub, err := js.Conn().Subscribe(subject, func(m *nats.Msg) {
		if reply := answer(asked.Add(1)); reply != nil {
			_ = m.Respond(reply)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return js, &asked
}

// A stream leader on the minority side of a partition never answers: the
// publish is sent again after an attempt's time, not held for the caller's
// whole deadline. The "stream" drops the first request, as a cut-off
// leader does, and acks the second.
func TestPublishRetriesAnUnansweredAttempt(t *testing.T) {
	js, asked := fakeStream(t, "lost.leader", func(n int32) []byte {
		if n == 1 {
			return nil
		}
		return []byte(`{"stream":"S","seq":7}`)
	})
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
	js, asked := fakeStream(t, "refusing", func(int32) []byte {
		return []byte(`{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}`)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := consumer.Publish(ctx, js, nats.NewMsg("refusing"))
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
	js, _ := fakeStream(t, "silent", func(int32) []byte { return nil })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := consumer.Publish(ctx, js, nats.NewMsg("silent")); !errors.Is(err, kvrec.ErrUnavailable) {
		t.Fatalf("publish: %v, want unavailable", err)
	}
}
