package monitors

import (
	"context"
	"time"
)

// Gather gathers the lines read from in into batches and hands each to
// flush: a batch closes BatchWindow after its first line, or at once when
// it holds MaxBatchLines. It returns when in is closed (after flushing
// what it holds), when ctx ends, or with flush's first error. The timer
// is time's, so a test drives it with testing/synctest.
func Gather(ctx context.Context, in <-chan string, flush func(ctx context.Context, lines []string) error) error {
	var (
		lines []string
		timer *time.Timer
		due   <-chan time.Time
	)
	send := func() error {
		if timer != nil {
			timer.Stop()
			timer, due = nil, nil
		}
		if len(lines) == 0 {
			return nil
		}
		out := lines
		lines = nil
		return flush(ctx, out)
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case l, ok := <-in:
			if !ok {
				return send()
			}
			lines = append(lines, CapLine(l))
			if len(lines) == 1 {
				timer = time.NewTimer(BatchWindow)
				due = timer.C
			}
			if len(lines) >= MaxBatchLines {
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
