package deliveries

import (
	"context"
	"errors"
	"time"

	"github.com/chime-nats/chime/internal/backoff"
	"github.com/chime-nats/chime/internal/kvrec"
)

// An engine restart or a reconnect loses the requests in flight: each
// read gets attemptTimeout to answer, and one that fails transiently is
// sent again, backing off as chime's record reads do, until the caller's
// deadline (then the storage is unavailable, which the caller is told).
const attemptTimeout = 2 * time.Second

var retries = backoff.Policy{Min: 25 * time.Millisecond, Max: 500 * time.Millisecond}

// retried runs op until it answers, ctx ends, or it fails for good.
func retried[T any](ctx context.Context, op func(context.Context) (T, error)) (T, error) {
	for n := 0; ; n++ {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		v, err := op(actx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return v, err
		}
		// The attempt's own time out is a request lost, not an answer.
		if !kvrec.Transient(err) && !errors.Is(err, context.DeadlineExceeded) {
			return v, err
		}
		if !retries.Sleep(ctx, n) {
			return v, err
		}
	}
}
