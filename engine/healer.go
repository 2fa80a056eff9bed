package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Healer re-creates chime's streams and buckets whenever one is found
// missing, not only at start: an operator's `nats stream rm`, or a server
// that came back without part of its store, must not stop firing until a
// restart. Consumers are re-created by their pools.
type Healer struct {
	js    jetstream.JetStream
	topo  Topology
	every time.Duration
	log   *slog.Logger

	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// NewHealer returns a Healer that checks every interval (default 2 s).
func NewHealer(js jetstream.JetStream, t Topology, every time.Duration, log *slog.Logger) *Healer {
	if every <= 0 {
		every = 2 * time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Healer{js: js, topo: t, every: every, log: log.With("component", "healer"), done: make(chan struct{})}
}

// Start begins checking in the background.
func (h *Healer) Start(ctx context.Context) error {
	ctx, h.cancel = context.WithCancel(ctx)
	go func() {
		defer close(h.done)
		t := time.NewTicker(h.every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			cctx, cancel := context.WithTimeout(ctx, h.every)
			healed, err := Heal(cctx, h.js, h.topo)
			cancel()
			if len(healed) > 0 {
				h.log.Warn("re-created missing resources", "resources", healed)
			}
			if err != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
				h.log.Debug("heal check", "err", err)
			}
		}
	}()
	return nil
}

// Stop ends the checks. Idempotent and safe without Start.
func (h *Healer) Stop(context.Context) error {
	h.once.Do(func() {
		if h.cancel == nil {
			return
		}
		h.cancel()
		<-h.done
	})
	return nil
}
