package monitors

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// SweepEvery is how often a replica sweeps its monitors: a timeout ends a
// monitor within about this much.
const SweepEvery = time.Second

// Sweeper runs Store.Sweep over the Index's due monitors every SweepEvery.
type Sweeper struct {
	store  *Store
	index  *Index
	every  time.Duration
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// NewSweeper returns the sweeper of store's monitors, as index lists them.
func NewSweeper(store *Store, index *Index, log *slog.Logger) *Sweeper {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Sweeper{store: store, index: index, every: SweepEvery, log: log.With("component", "monitors")}
}

// Start runs the sweeps until Stop.
func (w *Sweeper) Start(context.Context) error {
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel, w.done = cancel, make(chan struct{})
	go func() {
		defer close(w.done)
		t := time.NewTicker(w.every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				due := w.index.Due(w.store.now())
				if len(due) == 0 {
					continue
				}
				sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
				if n, err := w.store.Sweep(sctx, due); err != nil && ctx.Err() == nil {
					w.log.Warn("monitor sweep cut short", "stopped", n, "err", err)
				}
				scancel()
			}
		}
	}()
	return nil
}

// Stop ends the sweeps. Idempotent and safe without Start.
func (w *Sweeper) Stop(ctx context.Context) error {
	if w.cancel == nil {
		return nil
	}
	w.once.Do(w.cancel)
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
