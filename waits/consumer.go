package waits

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/prompts"
	"github.com/chime-nats/chime/subjects"
)

// waitQueue bounds wait.fire events in flight across replicas.
const waitQueue = 4096

// Durable consumer names of wait events.
const (
	WaitFiresDurable     = "chime-wait-fires"
	InterventionsDurable = "chime-interventions"
)

// ConsumerConfig configures Consumer.
type ConsumerConfig struct {
	JS     jetstream.JetStream
	Stream string
	Store  *Store
	// Inbox is where ended waits and interventions are delivered.
	Inbox *consumer.Inbox
	Log   *slog.Logger
	// Registerer receives the consumer's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Workers bounds concurrent wait completions.
	Workers int
	AckWait time.Duration
}

// Consumer ends waits: a wait.fire event completes its wait unless something
// ended it first, and an intervention.apply event cancels, pauses or
// resumes the agent's waits. Each ended wait gets its one terminal inbox
// delivery, published after the CAS that ended it and before the ack, so a
// crash in between is finished by the redelivery.
//
// Interventions are applied one at a time, in stream order (MaxAckPending
// 1), so a pause and the resume after it never cross.
type Consumer struct {
	cfg      ConsumerConfig
	log      *slog.Logger
	fires    *consumer.Pool
	ivs      *consumer.Pool
	ended    *prometheus.CounterVec
	fails    prometheus.Counter
	lateness prometheus.Histogram
}

// NewConsumer returns the wait consumers; Start begins consuming.
func NewConsumer(c ConsumerConfig) *Consumer {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Workers <= 0 {
		c.Workers = 64
	}
	if c.AckWait <= 0 {
		c.AckWait = 2 * time.Second
	}
	w := &Consumer{
		cfg: c,
		log: c.Log.With("component", "waits"),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chime_waits_ended_total", Help: "Waits ended, by outcome (completed, cancelled).",
		}, []string{"outcome"}),
		fails: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_wait_event_failures_total", Help: "Wait events that failed and were left for redelivery.",
		}),
		lateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "chime_wait_complete_lateness_seconds",
			Help:    "Time from a wait's target to its wait_complete delivery being stored.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
	}
	w.ended.WithLabelValues("completed")
	w.ended.WithLabelValues("cancelled")
	if c.Registerer != nil {
		c.Registerer.MustRegister(w.ended, w.fails, w.lateness)
	}
	return w
}

// CompletionText renders a wait's completion text from its framework prompt.
func CompletionText(w *subjects.Wait) (string, error) {
	return prompts.Render("fw.wait_complete.md", map[string]string{"target_time": subjects.FormatISO(w.Target())})
}

// Start creates (or joins) the shared durable consumers and begins.
func (w *Consumer) Start(ctx context.Context) error {
	fires, err := w.cfg.JS.CreateOrUpdateConsumer(ctx, w.cfg.Stream, jetstream.ConsumerConfig{
		Durable: WaitFiresDurable, Description: "wait.fire -> wait record + wait_complete",
		FilterSubject: subjects.WaitFire, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: w.cfg.AckWait, MaxAckPending: waitQueue,
	})
	if err != nil {
		return fmt.Errorf("waits: consumer: wait fires: %w", err)
	}
	ivs, err := w.cfg.JS.CreateOrUpdateConsumer(ctx, w.cfg.Stream, jetstream.ConsumerConfig{
		Durable: InterventionsDurable, Description: "intervention.apply -> cancel, pause or resume waits",
		FilterSubject: subjects.InterventionApply, AckPolicy: jetstream.AckExplicitPolicy,
		// An intervention touches every wait of its agent; give it time, and
		// keep them in order.
		AckWait: 30 * time.Second, MaxAckPending: 1,
	})
	if err != nil {
		return fmt.Errorf("waits: consumer: interventions: %w", err)
	}
	if w.fires, err = consumer.StartPool(ctx, fires, consumer.PoolConfig{
		Name: WaitFiresDurable, Workers: w.cfg.Workers,
		Timeout: 20 * time.Second, NakDelay: 500 * time.Millisecond, Fails: w.fails,
	}, w.log, w.fire); err != nil {
		return err
	}
	if w.ivs, err = consumer.StartPool(ctx, ivs, consumer.PoolConfig{
		Name: InterventionsDurable, Workers: 1,
		Timeout: 20 * time.Second, NakDelay: 500 * time.Millisecond, Fails: w.fails,
	}, w.log, w.intervene); err != nil {
		w.fires.Stop()
		return err
	}
	return nil
}

// Stop drains both consumers and waits for in-flight work. Idempotent.
func (w *Consumer) Stop() {
	w.ivs.Stop()
	w.fires.Stop()
}

func (w *Consumer) fire(ctx context.Context, data []byte) error {
	var ev subjects.WaitFired
	if err := json.Unmarshal(data, &ev); err != nil || subjects.ValidateID("agent_id", ev.AgentID) != nil {
		return fmt.Errorf("%w: %v", consumer.ErrPoison, err)
	}
	rec, ended, err := w.cfg.Store.Complete(ctx, &ev)
	if err != nil || !ended {
		return err // not ended: cancelled, paused or moved; nothing to say
	}
	text, err := CompletionText(rec)
	if err != nil {
		return fmt.Errorf("%w: %v", consumer.ErrPoison, err)
	}
	if err := w.deliver(ctx, rec, text); err != nil {
		return err
	}
	w.lateness.Observe(time.Since(ev.Target).Seconds())
	return nil
}

func (w *Consumer) intervene(ctx context.Context, data []byte) error {
	var iv subjects.Intervention
	if err := json.Unmarshal(data, &iv); err != nil || subjects.ValidateID("agent_id", iv.AgentID) != nil {
		return fmt.Errorf("%w: %v", consumer.ErrPoison, err)
	}
	switch iv.Action {
	case subjects.ActionPause:
		return w.cfg.Store.Pause(ctx, iv.AgentID, iv.At)
	case subjects.ActionResume:
		return w.cfg.Store.Resume(ctx, iv.AgentID, iv.At)
	}
	all, err := w.cfg.Store.List(ctx, iv.AgentID)
	if err != nil {
		return err
	}
	for _, rec := range all {
		// A redelivery also re-sends what this intervention cancelled
		// before a crash; the envelope ID makes that a no-op if it landed.
		if rec.Status != subjects.WaitWaiting && rec.CancelledBy != iv.ID {
			continue
		}
		cancelled, ended, err := w.cfg.Store.Cancel(ctx, iv.AgentID, rec.ID, iv.ID, iv.CancelText())
		if err != nil {
			return err
		}
		if ended {
			if err := w.deliver(ctx, cancelled, cancelled.CancelText); err != nil {
				return err
			}
		}
	}
	env := subjects.InterventionEnvelope(&iv)
	return w.publish(ctx, &env)
}

// deliver publishes an ended wait's terminal envelope and waits for it to
// be stored.
func (w *Consumer) deliver(ctx context.Context, rec *subjects.Wait, text string) error {
	env := subjects.WaitEndEnvelope(rec, text, time.Now())
	if err := w.publish(ctx, &env); err != nil {
		return err
	}
	w.ended.WithLabelValues(string(rec.Status)).Inc()
	return nil
}

func (w *Consumer) publish(ctx context.Context, env *subjects.Envelope) error {
	_, err := w.cfg.Inbox.Deliver(ctx, env)
	return err
}
