package timers

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/subjects"
)

// FiresDurable is the durable consumer name on the events stream.
const FiresDurable = "chime-timer-fires"

// FiresConfig configures Fires.
type FiresConfig struct {
	JS     jetstream.JetStream
	Stream string
	Store  *Store
	Log    *slog.Logger
	// Registerer receives the consumer's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Workers bounds concurrent record updates.
	Workers int
	// MaxAckPending bounds fires in flight across all replicas.
	MaxAckPending int
	// AckWait is how long a fire held by a replica may go unacked before
	// another replica gets it: it bounds how long a record lags its inbox
	// when a replica dies holding fires. Redelivery to a live replica is
	// harmless.
	AckWait time.Duration
}

// Fires applies timer.fire events to their timer records, then acks. The
// record CAS runs on a bounded pool so the consume callback never waits.
type Fires struct {
	cfg     FiresConfig
	log     *slog.Logger
	pool    *consumer.Pool
	applied prometheus.Counter
	fails   prometheus.Counter
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
		cfg: c,
		log: c.Log.With("component", "fires"),
		applied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_timer_fires_applied_total", Help: "Fire events applied to their timer records (repeats of an applied one not counted).",
		}),
		fails: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_timer_fire_apply_failures_total", Help: "Fire events whose record update failed and was left for redelivery.",
		}),
	}
	if c.Registerer != nil {
		c.Registerer.MustRegister(f.applied, f.fails)
	}
	return f
}

// Start creates (or joins) the shared durable consumer and begins delivery.
func (f *Fires) Start(ctx context.Context) error {
	cons, err := f.cfg.JS.CreateOrUpdateConsumer(ctx, f.cfg.Stream, jetstream.ConsumerConfig{
		Durable:       FiresDurable,
		Description:   "timer.fire -> timer record",
		FilterSubject: subjects.TimerFire,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       f.cfg.AckWait,
		MaxAckPending: f.cfg.MaxAckPending,
	})
	if err != nil {
		return fmt.Errorf("timers: fires consumer: %w", err)
	}
	f.pool, err = consumer.StartPool(ctx, cons, consumer.PoolConfig{
		Name: FiresDurable, Workers: f.cfg.Workers,
		Timeout: 10 * time.Second, NakDelay: time.Second, Fails: f.fails,
	}, f.log, f.apply)
	return err
}

// Stop drains the consumer (in-flight messages finish) and waits for the
// workers. It is idempotent.
func (f *Fires) Stop() { f.pool.Stop() }

// apply applies a fire to its timer record.
func (f *Fires) apply(ctx context.Context, data []byte) error {
	var ev subjects.TimerFired
	if err := json.Unmarshal(data, &ev); err != nil || subjects.ValidateID("agent_id", ev.AgentID) != nil {
		return fmt.Errorf("%w: %v", consumer.ErrPoison, err)
	}
	applied, err := f.cfg.Store.ApplyFire(ctx, &ev)
	if err != nil {
		return fmt.Errorf("fire %s: %w", ev.MsgID(), err)
	}
	if applied {
		f.applied.Inc()
	}
	return nil
}
