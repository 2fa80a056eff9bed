package waits

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/interventions"
	"github.com/chime-nats/chime/prompts"
	"github.com/chime-nats/chime/subjects"
)

// waitQueue bounds wait.fire events in flight across replicas.
const waitQueue = 4096

// Interventions in flight across replicas, and workers per replica: many
// agents' interventions apply at once; each agent's still one at a time.
const (
	interventionQueue   = 1024
	interventionWorkers = 16
)

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
	// Agents keeps each agent's intervention cursor.
	Agents *agents.Store
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
// ended it first, and an intervention.apply.<agent> event cancels, pauses
// or resumes the agent's waits. Each ended wait gets its one terminal inbox
// delivery, published after the CAS that ended it and before the ack, so a
// crash in between is finished by the redelivery.
//
// Each agent's interventions apply strictly in stream order, across
// workers and replicas, so a pause and the resume after it never cross;
// different agents' apply concurrently, so one agent's slow or poison
// intervention holds up no other agent. The agent's record keeps a cursor,
// the stream sequence of its last intervention applied; an event applies
// only when it is the agent's first one after the cursor (see inTurn);
// until then the pool retries it locally, every NakDelay.
type Consumer struct {
	cfg      ConsumerConfig
	log      *slog.Logger
	fires    *consumer.Pool
	ivs      *consumer.Pool
	ivStream jetstream.Stream
	ended    *prometheus.CounterVec
	fails    prometheus.Counter
	skipped  prometheus.Counter
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
		skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_interventions_skipped_total",
			Help: "Interventions the consumer gave up on that a later intervention of the same agent stepped past.",
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
		c.Registerer.MustRegister(w.ended, w.fails, w.skipped, w.lateness)
	}
	return w
}

// CompletionText renders a wait's completion text from its framework prompt.
func CompletionText(w *Wait) (string, error) {
	return prompts.Render("fw.wait_complete.md", map[string]string{"target_time": subjects.FormatISO(w.Target())})
}

// Start creates (or joins) the shared durable consumers and begins.
func (w *Consumer) Start(ctx context.Context) error {
	if w.cfg.Agents == nil {
		return errors.New("waits: consumer: no agents store for the intervention order")
	}
	var err error
	if w.ivStream, err = w.cfg.JS.Stream(ctx, w.cfg.Stream); err != nil {
		return fmt.Errorf("waits: consumer: stream: %w", err)
	}
	metrics := consumer.NewMetrics(w.cfg.Registerer)
	w.fires = consumer.NewPool(consumer.PoolConfig{
		Name: WaitFiresDurable, Workers: w.cfg.Workers,
		Timeout: 20 * time.Second, NakDelay: 500 * time.Millisecond, Fails: w.fails, Metrics: metrics,
		Create: func(ctx context.Context) (jetstream.Consumer, error) {
			return w.cfg.JS.CreateOrUpdateConsumer(ctx, w.cfg.Stream, consumer.Redelivery(jetstream.ConsumerConfig{
				Durable: WaitFiresDurable, Description: "wait.fire -> wait record + wait_complete",
				FilterSubject: subjects.WaitFire, AckWait: w.cfg.AckWait, MaxAckPending: waitQueue,
			}))
		},
	}, w.log, consumer.Data(w.fire))
	if err := w.fires.Start(ctx); err != nil {
		return fmt.Errorf("waits: consumer: wait fires: %w", err)
	}
	w.ivs = consumer.NewPool(consumer.PoolConfig{
		Name: InterventionsDurable, Workers: interventionWorkers,
		// An intervention touches every wait of its agent; the pool keeps
		// it in progress for as long as it takes. The agent's next one
		// waits for it in the pool, retried every NakDelay.
		Timeout: 20 * time.Second, NakDelay: 50 * time.Millisecond, WaitFor: 10 * time.Second,
		Fails: w.fails, Metrics: metrics,
		Create: func(ctx context.Context) (jetstream.Consumer, error) {
			return w.cfg.JS.CreateOrUpdateConsumer(ctx, w.cfg.Stream, consumer.Redelivery(jetstream.ConsumerConfig{
				Durable: InterventionsDurable, Description: "intervention.apply.<agent> -> cancel, pause or resume waits, in order per agent",
				FilterSubject: subjects.InterventionApplyAll, AckWait: w.cfg.AckWait, MaxAckPending: interventionQueue,
			}))
		},
	}, w.log, w.intervene)
	if err := w.ivs.Start(ctx); err != nil {
		_ = w.fires.Stop(ctx)
		return fmt.Errorf("waits: consumer: interventions: %w", err)
	}
	return nil
}

// Stop drains both consumers, side by side so their drain bounds do not
// add up, and waits for in-flight work. Idempotent and safe without Start.
func (w *Consumer) Stop(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { _ = w.ivs.Stop(ctx) })
	_ = w.fires.Stop(ctx)
	wg.Wait()
	return nil
}

func (w *Consumer) fire(ctx context.Context, data []byte) error {
	var ev WaitFired
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
	// The progress stream ends as Agent Zero's does; core NATS, like
	// every progress message: a lost one is not worth a retry.
	if data, err := json.Marshal(DoneWaitProgress(rec.ID)); err == nil {
		_ = w.cfg.JS.Conn().Publish(subjects.Agent(rec.AgentID, ActionWaitProgress), data)
	}
	return nil
}

// intervene applies the intervention event d when it is its agent's turn.
func (w *Consumer) intervene(ctx context.Context, d *consumer.Delivery) error {
	agentID, err := subjects.ParseInterventionApply(d.Subject)
	if err != nil {
		return fmt.Errorf("%w: %v", consumer.ErrPoison, err) // in no agent's order
	}
	// The ack floor is asked for on the first attempt and every tenth
	// local retry, not on each.
	epoch, err := w.epoch(ctx)
	if err != nil {
		return err
	}
	applied, err := w.inTurn(ctx, agentID, d.StreamSeq, epoch, d.Attempt%10 == 1)
	if err != nil || applied {
		return err
	}
	err = w.apply(ctx, agentID, d.Data)
	switch {
	case errors.Is(err, consumer.ErrPoison):
		// Given up on now: the agent's later interventions go ahead.
		if derr := w.cfg.Agents.InterventionDone(ctx, agentID, d.StreamSeq, epoch); derr != nil {
			return derr // retried: it is poison again, and then recorded
		}
		return err
	case err != nil && d.Last:
		// The pool gives up on it; let the agent's next one step past at
		// once rather than when the ack floor passes it.
		if derr := w.cfg.Agents.InterventionDone(ctx, agentID, d.StreamSeq, epoch); derr == nil {
			w.skipped.Inc()
		}
		return err
	case err != nil:
		return err
	}
	return w.cfg.Agents.InterventionDone(ctx, agentID, d.StreamSeq, epoch)
}

// inTurn reports whether the agent's intervention at stream sequence seq
// is applied already (at or below the cursor), nil when it is
// the agent's next one, and ErrNotYet while an earlier one of the agent is
// pending. With floor, an earlier one the consumer gave up on (at or below
// its ack floor, yet past the cursor: terminated without being applied or
// recorded) is stepped past.
//
// One handler at a time holds a given event (the pool keeps it in
// progress), and an event applies only when all the agent's earlier ones
// are done, so the agent's interventions never apply concurrently.
// epoch names the events stream the interventions are in: its creation
// time. Asked each time, so a stream made anew is noticed at once.
func (w *Consumer) epoch(ctx context.Context) (int64, error) {
	info, err := w.ivStream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("waits: events stream: %w", err)
	}
	return info.Created.UnixNano(), nil
}

func (w *Consumer) inTurn(ctx context.Context, agentID string, seq uint64, epoch int64, floor bool) (applied bool, err error) {
	for {
		st, _, err := w.cfg.Agents.Get(ctx, agentID)
		if err != nil {
			return false, err
		}
		cursor := agents.InterventionCursor(st, epoch)
		if seq <= cursor {
			return true, nil
		}
		first, err := w.ivStream.GetMsg(ctx, cursor+1, jetstream.WithGetMsgSubject(subjects.InterventionApply(agentID)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return false, nil // aged out of the stream meanwhile: nothing before it to wait for
		}
		if err != nil {
			return false, fmt.Errorf("waits: intervention order of %s: %w", agentID, err)
		}
		if first.Sequence >= seq {
			return false, nil
		}
		if !floor {
			return false, consumer.ErrNotYet
		}
		cons, err := w.cfg.JS.Consumer(ctx, w.cfg.Stream, InterventionsDurable)
		if err != nil {
			return false, fmt.Errorf("waits: intervention order of %s: %w", agentID, err)
		}
		if first.Sequence > cons.CachedInfo().AckFloor.Stream {
			return false, consumer.ErrNotYet
		}
		// At or below the ack floor: acked once applied (the cursor moves
		// before the ack, so a fresh read shows it), or given up unrecorded.
		if st, _, err = w.cfg.Agents.Get(ctx, agentID); err != nil {
			return false, err
		}
		if agents.InterventionCursor(st, epoch) >= first.Sequence {
			continue
		}
		w.log.Warn("stepping past an intervention that was given up", "agent_id", agentID, "stream_seq", first.Sequence, "next", seq)
		if err := w.cfg.Agents.InterventionDone(ctx, agentID, first.Sequence, epoch); err != nil {
			return false, err
		}
		w.skipped.Inc()
	}
}

// apply applies one intervention of agentID.
func (w *Consumer) apply(ctx context.Context, agentID string, data []byte) error {
	var iv interventions.Intervention
	if err := json.Unmarshal(data, &iv); err != nil || iv.AgentID != agentID {
		return fmt.Errorf("%w: intervention for %s: %v", consumer.ErrPoison, agentID, err)
	}
	switch iv.Action {
	case interventions.ActionPause:
		return w.cfg.Store.Pause(ctx, iv.AgentID, iv.At)
	case interventions.ActionResume:
		return w.cfg.Store.Resume(ctx, iv.AgentID, iv.At)
	}
	all, err := w.cfg.Store.List(ctx, iv.AgentID)
	if err != nil {
		return err
	}
	for _, rec := range all {
		// A redelivery also re-sends what this intervention cancelled
		// before a crash; the envelope ID makes that a no-op if it landed.
		if rec.Status != WaitWaiting && rec.CancelledBy != iv.ID {
			continue
		}
		if rec.Status == WaitWaiting && rec.CreatedAt.After(iv.At) {
			// Requested after the intervention was acknowledged (the
			// event is applied after its reply): not one it cancels.
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
	env := interventions.InterventionEnvelope(&iv)
	return w.publish(ctx, &env, iv.At)
}

// deliver publishes an ended wait's terminal envelope and waits for it to
// be stored.
func (w *Consumer) deliver(ctx context.Context, rec *Wait, text string) error {
	env := WaitEndEnvelope(rec, text, time.Now())
	if err := w.publish(ctx, &env, endedAt(rec)); err != nil {
		return err
	}
	w.ended.WithLabelValues(string(rec.Status)).Inc()
	return nil
}

// endedAt is when a wait ended: its terminal envelope cannot have been
// stored before.
func endedAt(w *Wait) time.Time {
	if w.EndedAt != nil {
		return *w.EndedAt
	}
	return w.CreatedAt
}

// publish delivers env, first sent no earlier than since: a redelivery
// after a downtime longer than the dedup window finds it in the inbox
// rather than storing it twice.
func (w *Consumer) publish(ctx context.Context, env *subjects.Envelope, since time.Time) error {
	ack, err := w.cfg.Inbox.DeliverOnce(ctx, env, since)
	if err == nil {
		w.log.Debug("wait envelope stored", "id", env.ID, "seq", ack.Sequence, "duplicate", ack.Duplicate)
	}
	return err
}
