// Package consumer owns delivery: the durable JetStream consumers, shared
// by all replicas, that turn internal events into inbox deliveries and
// record updates. A message is acked only after its side effects are
// durable; redelivery is harmless because every publish carries a stable
// Nats-Msg-Id and every record update is a CAS that skips what is applied.
package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// FiresDurable is the durable consumer name on the events stream.
const FiresDurable = "chime-timer-fires"

// FiresConfig configures Fires.
type FiresConfig struct {
	JS     jetstream.JetStream
	Stream string
	Store  *timers.Store
	Log    *slog.Logger
	// Registerer receives the consumer's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Workers bounds concurrent record updates.
	Workers int
	// MaxAckPending bounds fires in flight across all replicas.
	MaxAckPending int
	// AckWait is how long a fire held by a replica may go unacked before
	// another replica gets it: it bounds the extra inbox delay when a
	// replica dies holding fires. Redelivery to a live replica is harmless.
	AckWait time.Duration
}

// Fires delivers timer.fire events: a timer_fired envelope to the agent's
// inbox, then the fire applied to the timer record, then the ack.
//
// The inbox publish happens in the consume callback, in stream order and
// without waiting, so a burst of fires reaches inboxes at publish speed;
// the record CAS, which is slower, runs on a bounded pool behind it.
type Fires struct {
	cfg   FiresConfig
	log   *slog.Logger
	work  chan fireWork
	cc    jetstream.ConsumeContext
	wg    sync.WaitGroup
	once  sync.Once
	deliv *prometheus.CounterVec
	fails prometheus.Counter
}

type fireWork struct {
	msg jetstream.Msg
	ev  subjects.TimerFired
	fut jetstream.PubAckFuture // nil: not yet published (a redelivery)
}

// NewFires returns the fire consumer; Start begins consuming.
func NewFires(c FiresConfig) *Fires {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Workers <= 0 {
		c.Workers = 32
	}
	if c.MaxAckPending <= 0 {
		c.MaxAckPending = 20000
	}
	if c.AckWait <= 0 {
		c.AckWait = 2 * time.Second
	}
	f := &Fires{
		cfg:  c,
		log:  c.Log.With("component", "fires"),
		work: make(chan fireWork, c.MaxAckPending), // the consume callback never waits on CAS
		deliv: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chime_inbox_deliveries_total", Help: "Envelopes published to agent inboxes, by kind.",
		}, []string{"kind"}),
		fails: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_fire_delivery_failures_total", Help: "Fire deliveries that failed and were left for redelivery.",
		}),
	}
	f.deliv.WithLabelValues(subjects.KindTimerFired) // exported before the first fire
	if c.Registerer != nil {
		c.Registerer.MustRegister(f.deliv, f.fails)
	}
	return f
}

// Start creates (or joins) the shared durable consumer and begins delivery.
func (f *Fires) Start(ctx context.Context) error {
	cons, err := f.cfg.JS.CreateOrUpdateConsumer(ctx, f.cfg.Stream, jetstream.ConsumerConfig{
		Durable:       FiresDurable,
		Description:   "timer.fire -> agent inbox + timer record",
		FilterSubject: subjects.TimerFire,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       f.cfg.AckWait,
		MaxAckPending: f.cfg.MaxAckPending,
	})
	if err != nil {
		return fmt.Errorf("consumer: fires: %w", err)
	}
	for range f.cfg.Workers {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			for w := range f.work {
				f.finish(ctx, w)
			}
		}()
	}
	cc, err := cons.Consume(f.handle,
		jetstream.PullMaxMessages(1024),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if ctx.Err() == nil {
				f.log.Warn("consume", "err", err)
			}
		}))
	if err != nil {
		close(f.work)
		f.wg.Wait()
		return fmt.Errorf("consumer: fires consume: %w", err)
	}
	f.cc = cc
	return nil
}

// Stop drains the consumer (in-flight messages finish) and waits for the
// workers. It is idempotent.
func (f *Fires) Stop() {
	f.once.Do(func() {
		if f.cc == nil {
			return
		}
		f.cc.Drain()
		<-f.cc.Closed()
		close(f.work)
		f.wg.Wait()
	})
}

func (f *Fires) handle(msg jetstream.Msg) {
	var w fireWork
	w.msg = msg
	if err := json.Unmarshal(msg.Data(), &w.ev); err != nil || subjects.ValidateID("agent_id", w.ev.AgentID) != nil {
		f.log.Error("poison timer.fire event; terminated", "err", err)
		_ = msg.Term()
		return
	}
	if md, err := msg.Metadata(); err == nil && md.NumDelivered == 1 {
		fut, err := f.publish(&w.ev)
		if err == nil {
			w.fut = fut
		}
	}
	f.work <- w
}

func (f *Fires) publish(ev *subjects.TimerFired) (jetstream.PubAckFuture, error) {
	env := subjects.TimerFiredEnvelope(ev)
	data, err := json.Marshal(env)
	if err != nil {
		return nil, err
	}
	m := &nats.Msg{Subject: subjects.Inbox(ev.AgentID), Data: data, Header: nats.Header{}}
	m.Header.Set(subjects.HeaderKind, env.Kind)
	m.Header.Set(jetstream.MsgIDHeader, env.ID)
	return f.cfg.JS.PublishMsgAsync(m)
}

// finish makes the delivery durable, applies the fire to the record, acks.
func (f *Fires) finish(ctx context.Context, w fireWork) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := f.deliver(ctx, &w); err != nil {
		f.fails.Inc()
		if !errors.Is(err, context.Canceled) {
			f.log.Warn("fire delivery failed; will be redelivered", "fire", w.ev.MsgID(), "err", err)
		}
		_ = w.msg.NakWithDelay(time.Second)
		return
	}
	_ = w.msg.Ack()
}

func (f *Fires) deliver(ctx context.Context, w *fireWork) error {
	if w.fut == nil {
		// A redelivery. If the record has the occurrence, the inbox publish
		// that precedes every record update is known durable.
		applied, err := f.cfg.Store.Applied(ctx, &w.ev)
		if err != nil {
			return err
		}
		if applied {
			return nil
		}
		if w.fut, err = f.publish(&w.ev); err != nil {
			return fmt.Errorf("publish inbox: %w", err)
		}
	}
	select {
	case ack := <-w.fut.Ok():
		if !ack.Duplicate {
			f.deliv.WithLabelValues(subjects.KindTimerFired).Inc()
		}
	case err := <-w.fut.Err():
		return fmt.Errorf("publish inbox: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
	if _, err := f.cfg.Store.ApplyFire(ctx, &w.ev); err != nil {
		return err
	}
	return nil
}
