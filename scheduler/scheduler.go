package scheduler

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
)

// Config configures a Scheduler.
type Config struct {
	JS     jetstream.JetStream
	Timers jetstream.KeyValue
	Leases *Leases
	Shards int
	Now    func() time.Time
	Log    *slog.Logger
	// Registerer receives the scheduler's metrics; nil registers none.
	Registerer prometheus.Registerer
	// BatchSize bounds how many fires one pass publishes before it looks
	// at the index again.
	BatchSize int
}

// Scheduler fires the timers of the shards its replica owns.
type Scheduler struct {
	cfg  Config
	log  *slog.Logger
	wake chan struct{}

	mu    sync.Mutex
	index *index

	ready    chan struct{}
	pending  chan pendingFire
	cancel   context.CancelCauseFunc
	wg       sync.WaitGroup
	stopOnce sync.Once

	active     prometheus.GaugeFunc
	fires      prometheus.Counter
	deliveries *prometheus.CounterVec
	lateness   prometheus.Histogram
	failures   prometheus.Counter
}

// pendingFire is a published fire awaiting its acks.
type pendingFire struct {
	inbox, event jetstream.PubAckFuture
	err          error // the event publish failed to start
	key          string
	occ          int64
	due          int64
}

// New returns a Scheduler; Start begins its work.
func New(c Config) *Scheduler {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 1024
	}
	s := &Scheduler{
		cfg:     c,
		log:     c.Log.With("component", "scheduler"),
		wake:    make(chan struct{}, 1),
		index:   newIndex(c.Shards),
		ready:   make(chan struct{}),
		pending: make(chan pendingFire, 16384),
		fires: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_timer_fires_total", Help: "Timer occurrences published by this replica.",
		}),
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chime_inbox_deliveries_total", Help: "Envelopes stored in agent inboxes by this replica (duplicates not counted), by kind.",
		}, []string{"kind"}),
		lateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "chime_timer_fire_lateness_seconds",
			Help:    "Time from a timer's due time to the publish of its fire.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_timer_fire_publish_failures_total", Help: "Fire publishes that failed and were re-armed.",
		}),
	}
	s.active = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "chime_timers_active", Help: "Active timers known to this replica (all shards).",
	}, func() float64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return float64(len(s.index.entries))
	})
	s.deliveries.WithLabelValues(subjects.KindTimerFired) // exported before the first fire
	if c.Registerer != nil {
		c.Registerer.MustRegister(s.active, s.fires, s.deliveries, s.lateness, s.failures)
	}
	return s
}

// Wake makes the firing loop look at the index again; Leases calls it when
// the owned shards change.
func (s *Scheduler) Wake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Ready is closed once the index holds every timer stored at start.
func (s *Scheduler) Ready() <-chan struct{} { return s.ready }

// Start begins watching the timers bucket and firing. It does not block.
func (s *Scheduler) Start(ctx context.Context) error {
	w, err := s.cfg.Timers.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("scheduler: watch timers: %w", err)
	}
	ctx, s.cancel = context.WithCancelCause(ctx)
	s.wg.Add(3)
	go func() { defer s.wg.Done(); s.watch(ctx, w) }()
	go func() { defer s.wg.Done(); s.fireLoop(ctx) }()
	go func() { defer s.wg.Done(); s.ackLoop(ctx) }()
	return nil
}

// Stop ends the loops and waits for them. It is idempotent.
func (s *Scheduler) Stop() {
	s.stopOnce.Do(func() {
		if s.cancel != nil {
			s.cancel(errors.New("scheduler stopped"))
		}
		s.wg.Wait()
	})
}

func (s *Scheduler) watch(ctx context.Context, w jetstream.KeyWatcher) {
	defer func() { _ = w.Stop() }()
	initial := true
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				s.log.Error("timer watch closed")
				return
			}
			if e == nil {
				if initial {
					initial = false
					close(s.ready)
					s.log.Info("timer index loaded", "timers", s.activeCount())
				}
				continue
			}
			s.apply(e)
		}
	}
}

func (s *Scheduler) activeCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.index.entries)
}

// apply folds one record change into the index.
func (s *Scheduler) apply(e jetstream.KeyValueEntry) {
	key := e.Key()
	if e.Operation() != jetstream.KeyValuePut {
		s.mu.Lock()
		s.index.remove(key)
		s.mu.Unlock()
		return
	}
	var t subjects.Timer
	if err := json.Unmarshal(e.Value(), &t); err != nil {
		s.log.Error("undecodable timer record", "key", key, "err", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.Status != subjects.TimerActive || t.NextFireAt == nil {
		s.index.remove(key)
		return
	}
	en, ok := s.index.entries[key]
	if !ok {
		en = &entry{key: key, agentLen: len(t.AgentID), shard: shardOf(key, s.cfg.Shards), pos: -1}
		s.index.entries[key] = en
	}
	en.text = t.FireText()
	en.interval = t.Interval()
	next := t.FireCount + 1
	if en.fired >= next {
		// We published past this record already; its update is on the way.
		return
	}
	wasFirst := false
	if h := s.index.shards[en.shard]; len(h) == 0 || t.NextFireAt.UnixNano() < h[0].due {
		wasFirst = true
	}
	en.occ = next
	en.due = t.NextFireAt.UnixNano()
	s.index.arm(en)
	if wasFirst {
		s.Wake()
	}
}

func (s *Scheduler) fireLoop(ctx context.Context) {
	owned := make([]bool, s.cfg.Shards)
	batch := make([]*entry, 0, s.cfg.BatchSize)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := s.cfg.Now()
		s.cfg.Leases.Owned(now, owned)
		s.mu.Lock()
		batch = s.index.popDue(owned, now.UnixNano(), s.cfg.BatchSize, batch[:0])
		fires := s.prepare(batch, now)
		next, armed := s.index.next(owned)
		s.mu.Unlock()
		s.publish(ctx, fires)
		if len(batch) == s.cfg.BatchSize {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		wait := time.Hour
		if armed {
			wait = time.Duration(next - s.cfg.Now().UnixNano())
		}
		if wait <= 0 {
			continue
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// prepare advances each popped entry past the occurrence it is about to
// fire and returns the events. Called with s.mu held.
func (s *Scheduler) prepare(batch []*entry, now time.Time) []subjects.TimerFired {
	fires := make([]subjects.TimerFired, 0, len(batch))
	for _, en := range batch {
		due := time.Unix(0, en.due).UTC()
		fires = append(fires, subjects.TimerFired{
			AgentID: en.agentID(), TimerID: en.timerID(), Occurrence: en.occ,
			DueAt: due, FiredAt: now.UTC(), Text: en.text,
		})
		en.fired = en.occ
		if en.interval > 0 {
			en.occ++
			en.due = subjects.NextOccurrence(due, en.interval, now).UnixNano()
			s.index.arm(en)
		}
		s.lateness.Observe(now.Sub(due).Seconds())
	}
	return fires
}

// publish sends the batch's inbox envelopes first, so a burst reaches
// agents at publish speed, then the timer.fire events the consumer turns
// into record updates. Both are asynchronous and carry stable message IDs,
// so a re-armed or taken-over occurrence publishes again harmlessly.
func (s *Scheduler) publish(ctx context.Context, fires []subjects.TimerFired) {
	pend := make([]pendingFire, 0, len(fires))
	idx := make([]int, 0, len(fires)) // pend[j] fires fires[idx[j]]
	for i := range fires {
		f := &fires[i]
		p := pendingFire{key: subjects.TimerKey(f.AgentID, f.TimerID), occ: f.Occurrence, due: f.DueAt.UnixNano()}
		msg, err := inboxMsg(f)
		if err == nil {
			p.inbox, err = s.cfg.JS.PublishMsgAsync(msg)
		}
		if err != nil {
			s.rearm(p.key, p.occ, p.due, err)
			continue
		}
		pend, idx = append(pend, p), append(idx, i)
	}
	for j := range pend {
		p := &pend[j]
		msg, err := eventMsg(&fires[idx[j]])
		if err == nil {
			p.event, err = s.cfg.JS.PublishMsgAsync(msg)
		}
		if err != nil {
			p.err = err
		}
		select {
		case s.pending <- *p:
		case <-ctx.Done():
			return
		}
	}
}

func inboxMsg(f *subjects.TimerFired) (*nats.Msg, error) {
	env := subjects.TimerFiredEnvelope(f)
	data, err := json.Marshal(env)
	if err != nil {
		return nil, fmt.Errorf("encode envelope: %w", err)
	}
	m := &nats.Msg{Subject: subjects.Inbox(f.AgentID), Data: data, Header: nats.Header{}}
	m.Header.Set(subjects.HeaderKind, env.Kind)
	m.Header.Set(jetstream.MsgIDHeader, env.ID)
	return m, nil
}

func eventMsg(f *subjects.TimerFired) (*nats.Msg, error) {
	data, err := json.Marshal(f)
	if err != nil {
		return nil, fmt.Errorf("encode fire: %w", err)
	}
	m := &nats.Msg{Subject: subjects.TimerFire, Data: data, Header: nats.Header{}}
	m.Header.Set(jetstream.MsgIDHeader, f.MsgID())
	return m, nil
}

// ackLoop confirms published fires in order; a failed one is re-armed so
// the next pass publishes it again under the same message IDs.
func (s *Scheduler) ackLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-s.pending:
			err := p.err
			if err == nil {
				var dup bool
				if dup, err = awaitAck(ctx, p.inbox); err == nil && !dup {
					s.deliveries.WithLabelValues(subjects.KindTimerFired).Inc()
				}
			}
			if err == nil {
				_, err = awaitAck(ctx, p.event)
			}
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				s.rearm(p.key, p.occ, p.due, err)
			default:
				s.fires.Inc()
			}
		}
	}
}

// awaitAck waits for a publish ack and reports whether it was a duplicate.
func awaitAck(ctx context.Context, fut jetstream.PubAckFuture) (bool, error) {
	select {
	case ack := <-fut.Ok():
		return ack.Duplicate, nil
	case err := <-fut.Err():
		return false, err
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

func (s *Scheduler) rearm(key string, occ, due int64, cause error) {
	s.failures.Inc()
	s.log.Warn("fire publish failed; re-armed", "key", key, "occurrence", occ, "err", cause)
	s.mu.Lock()
	defer s.mu.Unlock()
	en, ok := s.index.entries[key]
	if !ok || en.fired < occ {
		return
	}
	en.fired = occ - 1
	en.occ = occ
	en.due = due + int64(100*time.Millisecond) // back off briefly before the retry
	s.index.arm(en)
	s.Wake()
}
