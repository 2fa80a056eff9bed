package consumer

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/backoff"
)

// PublishAttempt bounds one attempt of a JetStream publish made with a
// message ID. An ack takes milliseconds; a publish lost with its
// connection (a server cut off, found stale seconds later) or sent to a
// stream leader on the minority side of a partition is never answered,
// and waiting out the caller's whole deadline (a handler's 20 s) held a
// wait's ending for as long (measured: 29 s late after a 20 s cut of the
// inbox stream's leader). Retried, it goes out over the new connection or
// to the new leader.
const PublishAttempt = 3 * time.Second

// publishRetries paces the attempts: a stream back from an election is
// tried again within a second or two.
var publishRetries = backoff.Policy{Min: 100 * time.Millisecond, Max: 2 * time.Second}

// Publish stores m with js, each attempt bounded by PublishAttempt, until
// it is acknowledged, refused for cause, or ctx ends. m must carry a
// Nats-Msg-Id (or be otherwise idempotent): an attempt that timed out may
// have been stored, and the stream takes its retry as a duplicate.
func Publish(ctx context.Context, js jetstream.JetStream, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	for n := 0; ; n++ {
		actx, cancel := context.WithTimeout(ctx, PublishAttempt)
		ack, err := js.PublishMsg(actx, m, opts...)
		cancel()
		if err == nil || ctx.Err() != nil || !unanswered(err) {
			return ack, err
		}
		if !publishRetries.Sleep(ctx, n) {
			return nil, err
		}
	}
}

// unanswered reports whether a publish failed for want of an answer (no
// connection, no responder, no ack in time) rather than by the stream's
// refusal: only those are worth another attempt at once.
func unanswered(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrReconnectBufExceeded)
}
