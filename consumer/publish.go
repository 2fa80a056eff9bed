package consumer

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/kvrec"
)

// Publish stores m with js in attempts, as every record write is
// (kvrec.Retried: each bounded to a couple of seconds, retried with backoff
// while the engine does not answer, until ctx ends). An ack takes
// milliseconds; a publish lost with its connection (a server cut off,
// found stale seconds later) or sent to a stream leader on the minority
// side of a partition is never answered, and waiting out the caller's
// whole deadline (a handler's 20 s) held a wait's ending for as long
// (measured: 29 s late after a 20 s cut of the inbox stream's leader).
// m must carry a Nats-Msg-Id (or be otherwise idempotent): an attempt that
// got no answer may have been stored, and the stream takes its retry as a
// duplicate.
func Publish(ctx context.Context, js jetstream.JetStream, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return kvrec.Retried(ctx, func(ctx context.Context) (*jetstream.PubAck, error) {
		return js.PublishMsg(ctx, m, opts...)
	})
}
