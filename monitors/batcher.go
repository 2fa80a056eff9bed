package monitors

import (
	"context"
	"time"
)

// Gather gathers what is read from in into batches and hands each to
// flush: a batch closes BatchWindow after its first item, or at once when
// it holds MaxBatchLines. It returns when in is closed (after flushing
// what it holds), when ctx ends, or with flush's first error. The timer
// is time's, so a test drives it with testing/synctest. Callers cut their
// lines (CapLine) before they are queued, so that a batch holds no more
// than MaxBatchLines of MaxLineBytes.
func Gather[T any](ctx context.Context, in <-chan T, flush func(ctx context.Context, batch []T) error) error {
	var (
		batch []T
		timer *time.Timer
		due   <-chan time.Time
	)
	send := func() error {
		if timer != nil {
			timer.Stop()
			timer, due = nil, nil
		}
		if len(batch) == 0 {
			return nil
		}
		out := batch
		batch = nil
		return flush(ctx, out)
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case it, ok := <-in:
			if !ok {
				return send()
			}
			batch = append(batch, it)
			if len(batch) == 1 {
				timer = time.NewTimer(BatchWindow)
				due = timer.C
			}
			if len(batch) >= MaxBatchLines {
				if err := send(); err != nil {
					return err
				}
			}
		case <-due:
			if err := send(); err != nil {
				return err
			}
		}
	}
}
