// Package backoff owns how chime paces a retry: a delay that doubles from a
// floor to a ceiling, jittered over its upper half so that replicas, or the
// occurrences of one burst, retrying together spread out instead of
// striking again in lockstep.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Policy doubles from Min, the first retry's delay, up to Max.
type Policy struct {
	Min, Max time.Duration
}

// Delay is the jittered pause before retry n (0 for the first): Min
// doubled n times, at most Max, drawn from its upper half.
func (p Policy) Delay(n int) time.Duration {
	d := p.Max
	if n < 32 {
		if s := p.Min << n; s > 0 && s < p.Max {
			d = s
		}
	}
	return d/2 + rand.N(d/2+1)
}

// Sleep waits Delay(n); it returns false, at once, when ctx ends first.
func (p Policy) Sleep(ctx context.Context, n int) bool { return Sleep(ctx, p.Delay(n)) }

// Sleep waits d; it returns false, at once, when ctx ends first (or has
// ended: a non-positive d only reports ctx).
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
