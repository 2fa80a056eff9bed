package waitfor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/subjects"
)

// Durable consumer names.
const (
	WakesDurable    = "chime-waitfor-wakes"
	RechecksDurable = "chime-waitfor-rechecks"
)

// ConsumerConfig configures Consumer.
type ConsumerConfig struct {
	JS      jetstream.JetStream
	Service *Service
	Store   *Store
	// Index is this replica's view of the scope index.
	Index *Index
	// InboxStream is read for wakes, WaitForStream for due rechecks.
	InboxStream, WaitForStream string
	Log                        *slog.Logger
	Registerer                 prometheus.Registerer
	Workers                    int
	AckWait                    time.Duration
}

// Consumer is the one path by which registrations wake: every envelope
// stored in an inbox is matched against its agent's live registrations.
// The durable consumers are shared by all replicas.
type Consumer struct {
	cfg      ConsumerConfig
	log      *slog.Logger
	wakes    *consumer.Pool
	rechecks *consumer.Pool
	fails    prometheus.Counter
}

// NewConsumer returns the WaitFor consumers; Start begins.
func NewConsumer(c ConsumerConfig) *Consumer {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Workers <= 0 {
		// A wake is a few round trips of waiting (a record read, its
		// CAS, the wait_woken publish, the index purge), little CPU: the
		// workers bound what is in flight, and sixteen fell behind the
		// results a loaded replica accepts (chime-bench waitfor).
		c.Workers = 64
	}
	if c.AckWait <= 0 {
		c.AckWait = consumer.DefaultAckWait
	}
	w := &Consumer{cfg: c, log: c.Log.With("component", "waitfor"), fails: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "chime_waitfor_event_failures_total", Help: "WaitFor events that failed and were left for redelivery.",
	})}
	if c.Registerer != nil {
		c.Registerer.MustRegister(w.fails)
	}
	return w
}

// Start creates (or joins) the durable consumers.
func (c *Consumer) Start(ctx context.Context) error {
	if c.cfg.Index == nil {
		return errors.New("waitfor: consumer: no index view")
	}
	metrics := consumer.NewMetrics(c.cfg.Registerer)
	c.wakes = consumer.NewPool(consumer.PoolConfig{
		Name: WakesDurable, Workers: c.cfg.Workers, Timeout: 20 * time.Second, NakDelay: 500 * time.Millisecond,
		Fails: c.fails, Metrics: metrics,
		Create: func(ctx context.Context) (jetstream.Consumer, error) {
			cfg := consumer.Redelivery(jetstream.ConsumerConfig{
				Durable: WakesDurable, Description: "inbox envelopes -> WaitFor wakes",
				FilterSubject: subjects.InboxWildcard, AckWait: c.cfg.AckWait, MaxAckPending: 4096,
			})
			return c.createWakes(ctx, cfg)
		},
	}, c.log, c.wake)
	if err := c.wakes.Start(ctx); err != nil {
		return fmt.Errorf("waitfor: consumer: %w", err)
	}
	c.rechecks = consumer.NewPool(consumer.PoolConfig{
		Name: RechecksDurable, Workers: 4, Timeout: 20 * time.Second, NakDelay: 500 * time.Millisecond,
		Fails: c.fails, Metrics: metrics,
		Create: func(ctx context.Context) (jetstream.Consumer, error) {
			return c.cfg.JS.CreateOrUpdateConsumer(ctx, c.cfg.WaitForStream, consumer.Redelivery(jetstream.ConsumerConfig{
				Durable: RechecksDurable, Description: "due WaitFor rechecks -> recheck envelopes",
				FilterSubject: subjects.WaitForRecheckAll, AckWait: c.cfg.AckWait, MaxAckPending: 1024,
			}))
		},
	}, c.log, c.recheck)
	if err := c.rechecks.Start(ctx); err != nil {
		_ = c.wakes.Stop(ctx)
		return fmt.Errorf("waitfor: consumer: %w", err)
	}
	return nil
}

// Stop drains both consumers. Idempotent and safe without Start.
func (c *Consumer) Stop(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.rechecks.Stop(ctx) })
	_ = c.wakes.Stop(ctx)
	wg.Wait()
	return nil
}

// wake matches one inbox envelope against its agent's live registrations.
func (c *Consumer) wake(ctx context.Context, d *consumer.Delivery) error {
	var env subjects.Envelope
	if err := json.Unmarshal(d.Data, &env); err != nil || subjects.ValidateID("agent_id", env.AgentID) != nil {
		return fmt.Errorf("%w: inbox envelope: %v", consumer.ErrPoison, err)
	}
	if !concernsAny(&env) {
		return nil // e.g. its own wait_woken, or a wait's end: no index read
	}
	if c.cfg.Index.Absent(env.AgentID) {
		return nil // no registration, as a recent catch-up vouches: no read
	}
	// The view must hold every registration made before env was stored
	// (see Index): a lagging view would miss a wake, or name one replaced
	// before env was stored. The records the view names now are read
	// while it catches up; only those it still names then are applied,
	// with any it names only then.
	fresh := make(chan error, 1)
	go func() { fresh <- c.cfg.Index.Fresh(ctx) }()
	before := c.cfg.Index.entries(env.AgentID)
	read, err := c.cfg.Store.live(ctx, &env, before)
	if ferr := <-fresh; err == nil {
		err = ferr
	}
	if err != nil {
		return err
	}
	now := c.cfg.Index.entries(env.AgentID)
	later, err := c.cfg.Store.live(ctx, &env, missing(now, before))
	if err != nil {
		return err
	}
	for _, w := range append(read, later...) {
		if !slices.ContainsFunc(now, func(sc scope) bool { return sc.WaitID == w.ID }) {
			continue // no longer its scope's: replaced or ended
		}
		if _, err := c.cfg.Service.apply(ctx, w, &env, d.StreamSeq); err != nil {
			return err
		}
	}
	return nil
}

// missing returns the entries of now that name a registration before does not.
func missing(now, before []scope) []scope {
	var out []scope
	for _, sc := range now {
		if !slices.ContainsFunc(before, func(b scope) bool { return b.WaitID == sc.WaitID }) {
			out = append(out, sc)
		}
	}
	return out
}

func (c *Consumer) recheck(ctx context.Context, d *consumer.Delivery) error {
	agentID, waitID, err := subjects.ParseWaitForRecheck(d.Subject)
	if err != nil {
		return fmt.Errorf("%w: %v", consumer.ErrPoison, err)
	}
	return c.cfg.Service.Recheck(ctx, agentID, waitID)
}

// wakesReplay is how far back a new wakes consumer starts: not the whole
// inbox (days of envelopes that no registration can want, on the first
// start of this version), but enough to cover the wakes stored while a
// lost consumer was being re-created.
const wakesReplay = 10 * time.Minute

// createWakes creates the wakes consumer starting wakesReplay ago, or
// updates the existing one keeping where it starts: JetStream does not
// let a consumer's deliver policy change.
func (c *Consumer) createWakes(ctx context.Context, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	start := time.Now().Add(-wakesReplay)
	cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &start
	if existing, err := c.cfg.JS.Consumer(ctx, c.cfg.InboxStream, WakesDurable); err == nil {
		if info := existing.CachedInfo(); info != nil {
			cfg.DeliverPolicy, cfg.OptStartTime = info.Config.DeliverPolicy, info.Config.OptStartTime
		}
	}
	return c.cfg.JS.CreateOrUpdateConsumer(ctx, c.cfg.InboxStream, cfg)
}
