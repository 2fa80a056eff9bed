package callbacks

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/subjects"
)

// Durable is the shared consumer of accepted callbacks.
const Durable = "chime-callbacks"

// callbackQueue bounds accepted callbacks in flight across replicas.
const callbackQueue = 4096

// ConsumerConfig configures Consumer.
type ConsumerConfig struct {
	JS     jetstream.JetStream
	Stream string
	Store  *Store
	// Inbox is where the deliveries go.
	Inbox *consumer.Inbox
	Log   *slog.Logger
	// Registerer receives the consumer's metrics; nil registers none.
	Registerer prometheus.Registerer
	Workers    int
	AckWait    time.Duration
}

// Consumer turns accepted callbacks into inbox deliveries: a wake into a
// wake_hint (unless it was coalesced into the pending one), an enqueue
// into a message, both trust external. The delivery goes out before the
// ack, under the event's stable envelope ID, so a redelivery is absorbed.
type Consumer struct {
	cfg       ConsumerConfig
	log       *slog.Logger
	pool      *consumer.Pool
	delivered *prometheus.CounterVec
	fails     prometheus.Counter
}

// NewConsumer returns the consumer; Start begins consuming.
func NewConsumer(c ConsumerConfig) *Consumer {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Workers <= 0 {
		c.Workers = 32
	}
	if c.AckWait <= 0 {
		c.AckWait = 2 * time.Second
	}
	cb := &Consumer{
		cfg: c,
		log: c.Log.With("component", "callbacks"),
		delivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chime_callbacks_handled_total", Help: "Accepted callbacks handled, by kind (wake_hint, message) and disposition (triggered, enqueued, coalesced).",
		}, []string{"kind", "disposition"}),
		fails: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_callback_delivery_failures_total", Help: "Callback deliveries that failed and were left for redelivery.",
		}),
	}
	if c.Registerer != nil {
		c.Registerer.MustRegister(cb.delivered, cb.fails)
	}
	return cb
}

// Start creates (or joins) the shared durable consumer and begins.
func (cb *Consumer) Start(ctx context.Context) error {
	cb.pool = consumer.NewPool(consumer.PoolConfig{
		Name: Durable, Workers: cb.cfg.Workers,
		Timeout: 10 * time.Second, NakDelay: 200 * time.Millisecond, Fails: cb.fails,
		Metrics: consumer.NewMetrics(cb.cfg.Registerer),
		Create: func(ctx context.Context) (jetstream.Consumer, error) {
			return cb.cfg.JS.CreateOrUpdateConsumer(ctx, cb.cfg.Stream, consumer.Redelivery(jetstream.ConsumerConfig{
				Durable: Durable, Description: "callback.event.* -> wake_hint and message deliveries",
				FilterSubjects: []string{subjects.CallbackEventWake, subjects.CallbackEventEnqueue},
				AckWait:        cb.cfg.AckWait, MaxAckPending: callbackQueue,
			}))
		},
	}, cb.log, consumer.Data(cb.handle))
	if err := cb.pool.Start(ctx); err != nil {
		return fmt.Errorf("callbacks: consumer: %w", err)
	}
	return nil
}

// Stop drains the consumer and waits for in-flight work. Idempotent and
// safe without Start.
func (cb *Consumer) Stop(ctx context.Context) error { return cb.pool.Stop(ctx) }

func (cb *Consumer) handle(ctx context.Context, data []byte) error {
	var ev CallbackEvent
	if err := json.Unmarshal(data, &ev); err != nil || subjects.ValidateID("agent_id", ev.AgentID) != nil || ev.Payload == nil {
		return fmt.Errorf("%w: %v", consumer.ErrPoison, err)
	}
	env := CallbackEnvelope(&ev)
	if ev.Disposition == DispositionCoalesced {
		deliver, err := cb.unfold(ctx, &ev)
		if err != nil {
			return err
		}
		if !deliver {
			cb.delivered.WithLabelValues(env.Kind, ev.Disposition).Inc()
			return nil
		}
	}
	ack, err := cb.cfg.Inbox.DeliverOnce(ctx, &env, ev.At)
	if err != nil {
		return err
	}
	if ev.Mode == ModeWakeHint {
		// The hint is pending from here until the agent acks this sequence.
		if _, err := cb.cfg.Store.UpdateAgent(ctx, ev.AgentID, func(st *agents.AgentState) (bool, error) {
			if st.PendingWake == nil || st.PendingWake.EventID != ev.ID || st.PendingWake.InboxSeq == ack.Sequence {
				return false, nil
			}
			st.PendingWake.InboxSeq = ack.Sequence
			return true, nil
		}); err != nil {
			return err
		}
	}
	cb.delivered.WithLabelValues(env.Kind, ev.Disposition).Inc()
	return nil
}

// unfold decides whether a coalesced wake must be delivered after all:
// its pending hint was given back (a duplicate or failed store), or, once
// chime learnt where that hint landed, the agent's ack floor at the fold
// already covered it (the agent had taken it; folding would swallow this
// wake). Then the wake takes the pending slot itself. While the hint is
// still in flight, it waits (consumer.ErrNotYet).
func (cb *Consumer) unfold(ctx context.Context, ev *CallbackEvent) (bool, error) {
	st, _, err := cb.cfg.Store.Agent(ctx, ev.AgentID)
	if err != nil {
		return false, err
	}
	pw := st.PendingWake
	switch {
	case pw == nil:
	case pw.EventID != ev.CoalescedInto:
		return false, nil // a newer hint, claimed after this wake came, covers it
	case pw.InboxSeq == 0 && !WakeConsumed(pw, 0, time.Now()):
		return false, consumer.ErrNotYet
	case pw.InboxSeq != 0 && ev.FloorAtFold < pw.InboxSeq:
		return false, nil // the agent had not taken it: truly folded
	}
	claimed := false
	_, err = cb.cfg.Store.UpdateAgent(ctx, ev.AgentID, func(st *agents.AgentState) (bool, error) {
		cur := st.PendingWake
		if (pw == nil) != (cur == nil) || (cur != nil && cur.EventID != pw.EventID) {
			claimed = false
			return false, nil // another wake took the slot meanwhile, and covers this one
		}
		claimed = true
		st.PendingWake = &agents.PendingWake{EventID: ev.ID, ClaimedAt: time.Now().UTC()}
		return true, nil
	})
	return claimed, err
}
