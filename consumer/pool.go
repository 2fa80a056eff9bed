package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// ErrPoison marks an event that can never be applied: it is terminated,
// not redelivered.
var ErrPoison = errors.New("undecodable event")

// ErrNotYet asks for a quiet redelivery: the event waits on another's
// effects, which are on their way.
var ErrNotYet = errors.New("waiting on another event")

// Handler applies one event's effects; nil acks it, ErrPoison terminates
// it, any other error leaves it for redelivery.
type Handler func(ctx context.Context, data []byte) error

// PoolConfig shapes a pool.
type PoolConfig struct {
	Name     string        // for logs
	Workers  int           // concurrent handlers
	Timeout  time.Duration // per handler call
	NakDelay time.Duration // before a failed event is redelivered
	Fails    prometheus.Counter
}

// Pool runs a durable consumer onto a bounded set of workers, and acks
// each message only after its handler's effects are durable.
//
// It pulls only about two rounds of work ahead. A message pulled is on the
// AckWait clock; a deep local queue lets a backlog outlive AckWait, the
// server redelivers what is still queued, and the duplicates deepen the
// queue: throughput collapses (measured: waits seconds late). A backlog
// left on the server does not age, and any replica can take it.
type Pool struct {
	cfg  PoolConfig
	log  *slog.Logger
	work chan jetstream.Msg
	cc   jetstream.ConsumeContext
	wg   sync.WaitGroup
	once sync.Once
}

// StartPool consumes cons onto cfg.Workers workers running handle.
func StartPool(ctx context.Context, cons jetstream.Consumer, cfg PoolConfig, log *slog.Logger, handle Handler) (*Pool, error) {
	p := &Pool{cfg: cfg, log: log, work: make(chan jetstream.Msg, cfg.Workers)}
	for range cfg.Workers {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for m := range p.work {
				p.settle(ctx, m, handle)
			}
		}()
	}
	cc, err := cons.Consume(func(m jetstream.Msg) { p.work <- m }, jetstream.PullMaxMessages(2*cfg.Workers),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if ctx.Err() == nil {
				p.log.Warn("consume", "consumer", cfg.Name, "err", err)
			}
		}))
	if err != nil {
		close(p.work)
		p.wg.Wait()
		return nil, fmt.Errorf("consumer: %s consume: %w", cfg.Name, err)
	}
	p.cc = cc
	return p, nil
}

// Stop drains the consumer (in-flight messages finish) and waits for the
// workers. It is idempotent and safe on a nil pool.
func (p *Pool) Stop() {
	if p == nil {
		return
	}
	p.once.Do(func() {
		p.cc.Drain()
		<-p.cc.Closed()
		close(p.work)
		p.wg.Wait()
	})
}

func (p *Pool) settle(ctx context.Context, m jetstream.Msg, handle Handler) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	err := handle(ctx, m.Data())
	switch {
	case err == nil:
		_ = m.Ack()
	case errors.Is(err, ErrNotYet):
		_ = m.NakWithDelay(p.cfg.NakDelay)
	case errors.Is(err, ErrPoison):
		p.log.Error("poison event; terminated", "consumer", p.cfg.Name, "subject", m.Subject(), "err", err)
		_ = m.Term()
	default:
		p.cfg.Fails.Inc()
		if !errors.Is(err, context.Canceled) {
			p.log.Warn("event failed; will be redelivered", "consumer", p.cfg.Name, "subject", m.Subject(), "err", err)
		}
		_ = m.NakWithDelay(p.cfg.NakDelay)
	}
}
