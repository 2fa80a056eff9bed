package tasks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/internal/schedule"
	"github.com/chime-nats/chime/subjects"
)

// SettleDurable is the durable consumer of settle work items.
const SettleDurable = "chime-task-settle"

// DefaultSettleAfter is how long after a result is announced its work item
// is due: longer than any request that stores and delivers a result may
// run (api's request timeout is 10 s), so the reporter's own delivery is
// done or given up by then, and the item neither races it (which would
// show a core NATS subscriber the envelope twice, though it is stored
// once) nor finds a result still on its way.
const DefaultSettleAfter = 15 * time.Second

// SettlerConfig configures a Settler.
type SettlerConfig struct {
	JS         jetstream.JetStream
	Stream     string // the events stream
	Store      *Store
	Log        *slog.Logger
	Registerer prometheus.Registerer
	AckWait    time.Duration
}

// Settler delivers the results that their reporters stored but did not
// see delivered (chime died, the inbox publish failed, the reporter gave
// up): each result and cancel stores a work item on the events stream
// before the finished record, a JetStream message schedule that the
// engine delivers SettleAfter later, and a durable consumer shared by the
// replicas settles the task, redelivered by JetStream until it is done.
// Settling is idempotent, so a repeat delivers once.
type Settler struct {
	cfg   SettlerConfig
	log   *slog.Logger
	pool  *consumer.Pool
	fails prometheus.Counter
}

// NewSettler returns the settle consumer; Start begins.
func NewSettler(c SettlerConfig) *Settler {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.AckWait <= 0 {
		c.AckWait = consumer.DefaultAckWait
	}
	s := &Settler{cfg: c, log: c.Log.With("component", "tasks"), fails: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "chime_task_settle_failures_total", Help: "Task settle work items that failed and were left for redelivery.",
	})}
	if c.Registerer != nil {
		c.Registerer.MustRegister(s.fails)
	}
	return s
}

// Start creates (or joins) the durable consumer.
func (s *Settler) Start(ctx context.Context) error {
	s.pool = consumer.NewPool(consumer.PoolConfig{
		Name: SettleDurable, Workers: 8, Timeout: 20 * time.Second, NakDelay: 250 * time.Millisecond,
		Fails: s.fails, Metrics: consumer.NewMetrics(s.cfg.Registerer),
		Create: func(ctx context.Context) (jetstream.Consumer, error) {
			return s.cfg.JS.CreateOrUpdateConsumer(ctx, s.cfg.Stream, consumer.Redelivery(jetstream.ConsumerConfig{
				Durable: SettleDurable, Description: "task results stored -> their task_result delivered",
				FilterSubject: subjects.TaskSettleAll, AckWait: s.cfg.AckWait, MaxAckPending: 1024,
			}))
		},
	}, s.log, s.settle)
	if err := s.pool.Start(ctx); err != nil {
		return fmt.Errorf("tasks: settle consumer: %w", err)
	}
	return nil
}

// Stop drains the consumer. Idempotent and safe without Start.
func (s *Settler) Stop(ctx context.Context) error { return s.pool.Stop(ctx) }

// settle completes one work item's task. A task not finished by now never
// got the result the item announced (its request is over): nothing to do.
func (s *Settler) settle(ctx context.Context, d *consumer.Delivery) error {
	agentID, taskID, err := subjects.ParseTaskSettle(d.Subject)
	if err != nil {
		return fmt.Errorf("%w: %v", consumer.ErrPoison, err)
	}
	t, rev, err := s.cfg.Store.getRev(ctx, agentID, taskID)
	switch {
	case errors.Is(err, ErrTaskOwned) || errors.Is(err, ErrTaskNotFound) || (err == nil && !t.Finished()):
		s.log.Debug("settle work item without a result", "agent_id", agentID, "task_id", taskID)
		return nil
	case err != nil:
		return err
	}
	_, err = s.cfg.Store.settle(ctx, t, rev)
	return err
}

// announce stores the work item that settles the task if its reporter
// does not: before the finished record, so that no finished record is
// without one. A later announce of the task replaces it (a schedule is
// the last message on its subject).
func (s *Store) announce(ctx context.Context, agentID, taskID string) error {
	m := schedule.At(subjects.TaskSchedule(agentID, taskID), subjects.TaskSettle(agentID, taskID), s.now().Add(s.settleAfter))
	if _, err := consumer.Publish(ctx, s.js, m); err != nil {
		return fmt.Errorf("tasks: announce the result of %s: %w", taskID, err)
	}
	return nil
}
