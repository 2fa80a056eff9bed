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
	"github.com/chime-nats/chime/timers"
)

// Config configures a Scheduler.
type Config struct {
	JS     jetstream.JetStream
	Timers jetstream.KeyValue
	// Waits, when set, is the waits bucket: its waiting waits fire a
	// wait.fire event at their target and get progress about once a second.
	Waits  jetstream.KeyValue
	Leases *Leases
	Shards int
	Now    func() time.Time
	Log    *slog.Logger
	// Registerer receives the scheduler's metrics; nil registers none.
	Registerer prometheus.Registerer
	// BatchSize bounds how many fires one pass publishes before it looks
	// at the index again.
	BatchSize int
	// ProgressEvery is how often each wait's progress goes out (default 1s).
	ProgressEvery time.Duration
}

// Scheduler fires the timers and waits of the shards its replica owns and
// publishes the progress of those waits.
type Scheduler struct {
	cfg  Config
	log  *slog.Logger
	wake chan struct{}

	mu    sync.Mutex
	index *index

	ready    chan struct{}
	loading  sync.WaitGroup // one per watched bucket until its initial values are in
	pending  chan pendingFire
	cancel   context.CancelCauseFunc
	wg       sync.WaitGroup
	stopOnce sync.Once

	active     prometheus.GaugeFunc
	fires      prometheus.Counter
	deliveries *prometheus.CounterVec
	lateness   prometheus.Histogram
	failures   prometheus.Counter
	progress   prometheus.Counter
	waitGauge  prometheus.GaugeFunc
}

// pendingFire is a published fire awaiting its acks.
type pendingFire struct {
	inbox, event jetstream.PubAckFuture // inbox is nil for a wait
	err          error                  // the event publish failed to start
	wait         bool
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
	if c.ProgressEvery <= 0 {
		c.ProgressEvery = time.Second
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
		progress: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_wait_progress_total", Help: "Wait progress messages published by this replica.",
		}),
	}
	s.waitGauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "chime_waits_active", Help: "Waiting waits known to this replica (all shards).",
	}, func() float64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return float64(len(s.index.waits))
	})
	s.active = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "chime_timers_active", Help: "Active timers known to this replica (all shards).",
	}, func() float64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return float64(len(s.index.entries))
	})
	s.deliveries.WithLabelValues(subjects.KindTimerFired) // exported before the first fire
	if c.Registerer != nil {
		c.Registerer.MustRegister(s.active, s.fires, s.deliveries, s.lateness, s.failures, s.progress, s.waitGauge)
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

// Start begins watching the buckets and firing. It does not block.
func (s *Scheduler) Start(ctx context.Context) error {
	tw, err := s.cfg.Timers.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("scheduler: watch timers: %w", err)
	}
	var ww jetstream.KeyWatcher
	if s.cfg.Waits != nil {
		if ww, err = s.cfg.Waits.WatchAll(ctx); err != nil {
			_ = tw.Stop()
			return fmt.Errorf("scheduler: watch waits: %w", err)
		}
	}
	ctx, s.cancel = context.WithCancelCause(ctx)
	s.loading.Add(1)
	s.wg.Add(3)
	go func() { defer s.wg.Done(); s.watch(ctx, "timer", tw, s.applyTimer) }()
	if ww != nil {
		s.loading.Add(1)
		s.wg.Add(2)
		go func() { defer s.wg.Done(); s.watch(ctx, "wait", ww, s.applyWait) }()
		go func() { defer s.wg.Done(); s.progressLoop(ctx) }()
	}
	go func() {
		s.loading.Wait()
		close(s.ready)
		s.log.Info("index loaded", "timers", s.activeCount(false), "waits", s.activeCount(true))
	}()
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

func (s *Scheduler) watch(ctx context.Context, what string, w jetstream.KeyWatcher, apply func(jetstream.KeyValueEntry)) {
	defer func() { _ = w.Stop() }()
	loading := true
	defer func() {
		if loading {
			s.loading.Done()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				s.log.Error("watch closed", "bucket", what)
				return
			}
			if e == nil {
				if loading {
					loading = false
					s.loading.Done()
				}
				continue
			}
			apply(e)
		}
	}
}

func (s *Scheduler) activeCount(wait bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.index.table(wait))
}

// entryFor returns the index entry of key, creating it. Called with s.mu held.
func (s *Scheduler) entryFor(wait bool, key, agentID string) *entry {
	t := s.index.table(wait)
	en, ok := t[key]
	if !ok {
		en = &entry{key: key, agentLen: len(agentID), wait: wait, shard: shardOf(key, s.cfg.Shards), pos: -1}
		if wait {
			en.phase = int8(shardOf(key, 10*s.cfg.Shards) % 10)
		}
		t[key] = en
	}
	return en
}

// armAt arms en at due and wakes the firing loop when it became the first.
// Called with s.mu held.
func (s *Scheduler) armAt(en *entry, due int64) {
	h := s.index.shards[en.shard]
	first := len(h) == 0 || due < h[0].due
	en.due = due
	s.index.arm(en)
	if first {
		s.Wake()
	}
}

// applyTimer folds one timer record change into the index.
func (s *Scheduler) applyTimer(e jetstream.KeyValueEntry) {
	key := e.Key()
	if e.Operation() != jetstream.KeyValuePut {
		s.mu.Lock()
		s.index.remove(false, key)
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
		s.index.remove(false, key)
		return
	}
	en := s.entryFor(false, key, t.AgentID)
	en.text = t.FireText()
	en.interval = t.Interval()
	next := t.FireCount + 1
	if en.fired >= next {
		// We published past this record already; its update is on the way.
		return
	}
	en.occ = next
	s.armAt(en, t.NextFireAt.UnixNano())
}

// applyWait folds one wait record change into the index.
func (s *Scheduler) applyWait(e jetstream.KeyValueEntry) {
	key := e.Key()
	if e.Operation() != jetstream.KeyValuePut {
		s.mu.Lock()
		s.index.remove(true, key)
		s.mu.Unlock()
		return
	}
	var w subjects.Wait
	if err := json.Unmarshal(e.Value(), &w); err != nil {
		s.log.Error("undecodable wait record", "key", key, "err", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.Status != subjects.WaitWaiting {
		s.index.remove(true, key)
		return
	}
	en := s.entryFor(true, key, w.AgentID)
	if !w.Armed() {
		en.paused = max(w.Remaining(s.cfg.Now()), time.Nanosecond) // frozen clock
		en.due = w.TargetTime.UnixNano()
		s.index.disarm(en)
		return
	}
	en.paused = 0
	due := w.TargetTime.UnixNano()
	if en.fired == due {
		en.due = due // published for this target; the completion is on the way
		return
	}
	s.armAt(en, due)
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
		fires, waitFires := s.prepare(batch, now)
		next, armed := s.index.next(owned)
		s.mu.Unlock()
		s.publish(ctx, fires)
		s.publishWaits(ctx, waitFires)
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

// prepare advances each popped entry past what it is about to fire and
// returns the timer and wait fire events. Called with s.mu held.
func (s *Scheduler) prepare(batch []*entry, now time.Time) ([]subjects.TimerFired, []subjects.WaitFired) {
	var timerFires []subjects.TimerFired
	var waits []subjects.WaitFired
	for _, en := range batch {
		due := time.Unix(0, en.due).UTC()
		s.lateness.Observe(now.Sub(due).Seconds())
		if en.wait {
			waits = append(waits, subjects.WaitFired{AgentID: en.agentID(), WaitID: en.itemID(), Target: due, FiredAt: now.UTC()})
			en.fired = en.due
			continue
		}
		timerFires = append(timerFires, subjects.TimerFired{
			AgentID: en.agentID(), TimerID: en.itemID(), Occurrence: en.occ,
			DueAt: due, FiredAt: now.UTC(), Text: en.text,
		})
		en.fired = en.occ
		if en.interval > 0 {
			en.occ++
			en.due = timers.NextOccurrence(due, en.interval, now).UnixNano()
			s.index.arm(en)
		}
	}
	return timerFires, waits
}

// publishWaits sends wait.fire events; the consumer decides, by CAS against
// cancellation, whether the wait completes.
func (s *Scheduler) publishWaits(ctx context.Context, fires []subjects.WaitFired) {
	for i := range fires {
		f := &fires[i]
		p := pendingFire{wait: true, key: subjects.WaitKey(f.AgentID, f.WaitID), occ: 1, due: f.Target.UnixNano()}
		data, err := json.Marshal(f)
		if err == nil {
			m := &nats.Msg{Subject: subjects.WaitFire, Data: data, Header: nats.Header{}}
			m.Header.Set(jetstream.MsgIDHeader, f.MsgID())
			p.event, err = s.cfg.JS.PublishMsgAsync(m)
		}
		if err != nil {
			s.rearm(p, err)
			continue
		}
		select {
		case s.pending <- p:
		case <-ctx.Done():
			return
		}
	}
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
			s.rearm(p, err)
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
	return env.Msg()
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
			if err == nil && p.inbox != nil {
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
				s.rearm(p, err)
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

func (s *Scheduler) rearm(p pendingFire, cause error) {
	s.failures.Inc()
	s.log.Warn("fire publish failed; re-armed", "key", p.key, "occurrence", p.occ, "err", cause)
	s.mu.Lock()
	defer s.mu.Unlock()
	en, ok := s.index.table(p.wait)[p.key]
	if !ok {
		return
	}
	if p.wait {
		if en.fired != p.due {
			return
		}
		en.fired = 0
	} else {
		if en.fired < p.occ {
			return
		}
		en.fired = p.occ - 1
		en.occ = p.occ
	}
	en.due = p.due + int64(100*time.Millisecond) // back off briefly before the retry
	s.index.arm(en)
	s.Wake()
}

// progressLoop publishes each owned waiting wait's progress about once
// every ProgressEvery, a tenth of the waits at a time so that 10k waits
// never make one burst that would delay fires.
func (s *Scheduler) progressLoop(ctx context.Context) {
	tick := time.NewTicker(s.cfg.ProgressEvery / 10)
	defer tick.Stop()
	owned := make([]bool, s.cfg.Shards)
	type item struct {
		agent, wait string
		left        time.Duration
	}
	var items []item
	nc := s.cfg.JS.Conn()
	for phase := int8(0); ; phase = (phase + 1) % 10 {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := s.cfg.Now()
		s.cfg.Leases.Owned(now, owned)
		items = items[:0]
		s.mu.Lock()
		for _, en := range s.index.waits {
			if en.phase != phase || !owned[en.shard] {
				continue
			}
			left := en.paused
			if left == 0 {
				left = max(time.Duration(en.due-now.UnixNano()), 0)
			}
			items = append(items, item{en.agentID(), en.itemID(), left})
		}
		s.mu.Unlock()
		for _, it := range items {
			data, err := json.Marshal(subjects.NewWaitProgress(it.wait, it.left))
			if err != nil {
				continue
			}
			if err := nc.Publish(subjects.Agent(it.agent, subjects.ActionWaitProgress), data); err != nil {
				s.log.Debug("progress publish", "err", err)
				continue
			}
			s.progress.Inc()
		}
	}
}
