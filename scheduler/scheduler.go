package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/internal/kvwatch"
	"github.com/chime-nats/chime/internal/pacer"
	"github.com/chime-nats/chime/partitions"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waits"
)

// Recorder writes a delivered timer occurrence into its record; timers.Store
// is one. It reports false when there was nothing to write (applied
// before, cancelled first, or gone).
type Recorder interface {
	ApplyFire(ctx context.Context, ev *timers.TimerFired) (bool, error)
}

// Config configures a Scheduler.
type Config struct {
	// JS must time out unacknowledged async publishes
	// (jetstream.WithPublishAsyncTimeout): a fire waits on its ack.
	JS jetstream.JetStream
	// Timers and Waits are the buckets to index; nil Waits indexes no
	// waits. Their layout says whether a replica watches whole buckets or
	// only the keys of the shards it holds.
	Timers, Waits *partitions.Set
	// Counts receives, in the sharded layout, each held shard's count of
	// every agent's active records, which the create quotas sum (Counts).
	Counts jetstream.KeyValue
	// Inbox is the delivery path; it finds envelopes already stored when
	// an occurrence is older than the dedup window.
	Inbox *consumer.Inbox
	// Records receives each delivered timer occurrence.
	Records Recorder
	Leases  *Leases
	Shards  int
	Now     func() time.Time
	Log     *slog.Logger
	// Registerer receives the scheduler's metrics; nil registers none.
	Registerer prometheus.Registerer
	// BatchSize bounds how many fires one pass publishes before it looks
	// at the index again.
	BatchSize int
	// ProgressEvery is how often each wait's progress goes out (default 1s).
	ProgressEvery time.Duration
	// RecordWorkers bound concurrent record updates (default 16).
	RecordWorkers int
	// Heartbeat is the watches' heartbeat (kvwatch.Config.Heartbeat).
	Heartbeat time.Duration
	// AdoptLimit bounds how long a repeating timer's duplicate fire tries
	// to read the envelope stored under its ID (default 30 s; see
	// adoptStored).
	AdoptLimit time.Duration
}

// Scheduler fires the timers and waits of the shards its replica owns and
// publishes the progress of those waits. Start it once; Stop is idempotent
// and safe without Start.
type Scheduler struct {
	cfg    Config
	layout partitions.Layout
	log    *slog.Logger
	wake   chan struct{}

	mu    sync.Mutex
	index *index
	// shardStates says which shards' entries are kept and loaded;
	// loadGen numbers the replays that load gained shards, and watching
	// says the watches have begun (gains before that load with them).
	shardStates []shardState
	loadGen     uint64
	watching    bool
	// timers and waits know every active record of all shards, for the
	// quotas, in the unsharded layout; the sharded one writes counts
	// instead (nil here).
	timers, waits *presence
	counts        *countWriter
	readyClosed   bool // with mu

	ctx     context.Context
	watches []*kvwatch.Watch
	ready   chan struct{}
	pending chan pendingFire
	// adoptions are the duplicate fires whose stored envelope is to be
	// read (adoptStored).
	adoptions *adoptQueue
	records   *recordQueue
	// burstStart is when record updates began standing back for the
	// fires in flight (unix ns; 0: not now).
	burstStart atomic.Int64
	health     health
	// stalled is how many held shards the last look found stalled
	// (stallLoop).
	stalled atomic.Int64
	cancel  context.CancelCauseFunc
	wg      sync.WaitGroup
	stop    sync.Once

	m metrics
	// refusedLog paces the log of records passed over (refuse).
	refusedLog *pacer.Pacer
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
	if c.RecordWorkers <= 0 {
		c.RecordWorkers = 16
	}
	if c.AdoptLimit <= 0 {
		c.AdoptLimit = 30 * time.Second
	}
	s := &Scheduler{
		cfg:         c,
		layout:      partitions.Layout{Shards: c.Shards},
		log:         c.Log.With("component", "scheduler"),
		wake:        make(chan struct{}, 1),
		index:       newIndex(c.Shards),
		shardStates: make([]shardState, c.Shards),
		ctx:         context.Background(),
		ready:       make(chan struct{}),
		pending:     make(chan pendingFire, 16384),
		adoptions:   newAdoptQueue(),
		records:     newRecordQueue(),
	}
	if c.Timers != nil {
		s.layout = c.Timers.Layout
	}
	if s.layout.Sharded() {
		s.counts = newCountWriter(c.Counts, c.Log)
		s.index.keepCounts(s.counts.mark)
	} else {
		s.timers, s.waits = newPresence(), newPresence()
	}
	s.health.now = c.Now
	s.m = newMetrics(s)
	s.refusedLog = pacer.New(refusedLogInterval)
	if c.Registerer != nil {
		s.m.register(c.Registerer)
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

// Ready is closed once every timer and wait stored at start is counted
// and the shards leased by then are loaded.
func (s *Scheduler) Ready() <-chan struct{} { return s.ready }

// Start begins watching the buckets and firing, and returns once ready:
// every timer and wait stored at start counted and the shards leased by
// then loaded (Ready); ctx bounds that wait, and the scheduler runs under
// it until Stop. Start the leases first: the shards they hold by then load
// with the watches' first pass rather than a replay after it.
func (s *Scheduler) Start(ctx context.Context) error {
	life, cancel := context.WithCancelCause(ctx)
	s.cancel, s.ctx = cancel, life
	if err := s.start(life); err != nil {
		return err
	}
	select {
	case <-s.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("scheduler: loading the timer index: %w", ctx.Err())
	}
}

// start begins the watches and loops.
func (s *Scheduler) start(ctx context.Context) error {
	if s.layout.Sharded() {
		s.startSharded()
	} else if err := s.startWhole(ctx); err != nil {
		return err
	}
	s.wg.Add(4)
	go func() { defer s.wg.Done(); s.fireLoop(ctx, s.publish) }()
	go func() { defer s.wg.Done(); s.stallLoop(ctx) }()
	go func() { defer s.wg.Done(); s.ackLoop(ctx) }()
	go func() { defer s.wg.Done(); s.progressLoop(ctx) }()
	for range s.cfg.RecordWorkers {
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.recordLoop(ctx) }()
	}
	for range adoptWorkers {
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.adoptLoop(ctx) }()
	}
	if s.counts != nil {
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.counts.run(ctx, s) }()
	}
	return nil
}

// startWhole begins the watches of whole buckets, the unsharded layout:
// every replica sees every change, and keeps the held shards' entries.
func (s *Scheduler) startWhole(ctx context.Context) error {
	watches := []*kvwatch.Watch{kvwatch.New(kvwatch.Config{
		JS: s.cfg.JS, Bucket: s.cfg.Timers.KVs[0].Bucket(), Heartbeat: s.cfg.Heartbeat, Log: s.cfg.Log,
		Apply: func(e kvwatch.Entry) { s.applyTimer(s.cfg.Timers.KVs[0].Bucket(), 0, e) }, Reset: func() { s.reset(false) },
	})}
	if s.cfg.Waits != nil {
		watches = append(watches, kvwatch.New(kvwatch.Config{
			JS: s.cfg.JS, Bucket: s.cfg.Waits.KVs[0].Bucket(), Heartbeat: s.cfg.Heartbeat, Log: s.cfg.Log,
			Apply: func(e kvwatch.Entry) { s.applyWait(s.cfg.Waits.KVs[0].Bucket(), 0, e) }, Reset: func() { s.reset(true) },
		}))
	}
	// Under mu: the leases, started first, ask Healthy (wholeWatches)
	// meanwhile.
	s.mu.Lock()
	s.watches, s.watching = watches, true
	s.mu.Unlock()
	for _, w := range watches {
		if err := w.Start(ctx); err != nil {
			return fmt.Errorf("scheduler: %w", err)
		}
	}
	go func() {
		var loaded []<-chan struct{}
		for _, w := range watches {
			loaded = append(loaded, w.Loaded())
		}
		s.loadedWhen(ctx, 0, loaded...)
		if ctx.Err() != nil {
			return
		}
		close(s.ready)
		s.log.Info("index loaded", "shards", s.ShardsHeld(), "timers", s.activeCount(false), "waits", s.activeCount(true),
			"timers_all_shards", s.timers.len(), "waits_all_shards", s.waits.len())
	}()
	return nil
}

// Stop ends the loops and watches and waits for them. Fires published but
// not yet recorded are left to whoever fires their shard next: their IDs
// make the repeat harmless. Idempotent and safe without Start.
func (s *Scheduler) Stop(ctx context.Context) error {
	s.stop.Do(func() {
		if s.cancel != nil {
			s.cancel(errors.New("scheduler stopped"))
		}
		for _, w := range s.allWatches() {
			_ = w.Stop(ctx)
		}
		s.wg.Wait()
	})
	return nil
}

// Healthy reports whether this replica can fire: its watches are live and
// its publishes are going through. Leases gives its shards away while it
// is not.
func (s *Scheduler) Healthy() (bool, string) {
	if live, why := s.watchesLive(); !live {
		return false, why
	}
	return s.health.ok()
}

// ActiveTimers is how many active timers the agent has in every shard,
// as each replica watches the whole bucket in the unsharded layout: a
// few milliseconds behind it. It never waits for the firing loop. In the
// sharded layout, Counts answers instead.
func (s *Scheduler) ActiveTimers(_ context.Context, agentID string) (int, error) {
	if s.timers == nil {
		return 0, errNoPresence
	}
	return s.timers.get(agentID), nil
}

// ActiveWaits is how many waiting (or paused) waits the agent has, as
// ActiveTimers.
func (s *Scheduler) ActiveWaits(_ context.Context, agentID string) (int, error) {
	if s.waits == nil {
		return 0, errNoPresence
	}
	return s.waits.get(agentID), nil
}

// Admitted does nothing: the presence follows the buckets themselves.
func (s *Scheduler) Admitted(string, bool) {}

// errNoPresence: a sharded replica does not see every shard's records.
var errNoPresence = errors.New("scheduler: the sharded layout counts records in the counts bucket, not in each replica")

// presenceOf is the presence of timers or of waits.
func (s *Scheduler) presenceOf(wait bool) *presence {
	if wait {
		return s.waits
	}
	return s.timers
}

func (s *Scheduler) activeCount(wait bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.index.table(wait))
}

// reset forgets every timer or wait: their bucket is being reloaded.
func (s *Scheduler) reset(wait bool) {
	if p := s.presenceOf(wait); p != nil {
		p.reset()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for key := range s.index.table(wait) {
		s.index.remove(wait, key)
	}
}

// entryFor returns the index entry of key, creating it. Called with s.mu held.
func (s *Scheduler) entryFor(wait bool, key string, agentLen, shard int) *entry {
	t := s.index.table(wait)
	en, ok := t[key]
	if !ok {
		en = &entry{key: key, agentLen: agentLen, wait: wait, shard: shard, pos: -1}
		if wait {
			en.phase = int8(partitions.ShardOf(key, 10*s.cfg.Shards) % 10)
		}
		s.index.insert(en)
	}
	return en
}

// armAt arms en for an occurrence due at due and wakes the firing loop
// when it became the first. Called with s.mu held.
func (s *Scheduler) armAt(en *entry, due int64) {
	h := s.index.shards[en.shard]
	at := calendarAt(en, due)
	first := len(h) == 0 || at < h[0].at
	en.due, en.at, en.attempts = due, at, 0
	en.awaiting = false
	s.index.arm(en)
	if first {
		s.Wake()
	}
}

// removed records that the record at key is gone or finished. A shard
// not held has no entry to remove: its records, most of them on every
// replica, cost no wait behind a firing batch for the scheduler's lock.
func (s *Scheduler) removed(wait bool, key string, agentLen, shard int, gen uint64) {
	if p := s.presenceOf(wait); p != nil {
		p.set(key, agentLen, false)
	}
	if !s.holds(shard) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current(shard, gen) {
		s.index.remove(wait, key)
	}
}

// current reports, with mu held, whether shard is held and, for a watch
// of one shard's keys (gen > 0), still for the gain that watch serves: a
// watch of an earlier gain, still stopping, is behind the new one.
func (s *Scheduler) current(shard int, gen uint64) bool {
	return s.holds(shard) && (gen == 0 || s.shardStates[shard].gen == gen)
}

// applyTimer folds one timer record change into the index: every record
// counts in the presence, and the record of a held shard gets an entry.
func (s *Scheduler) applyTimer(bucket string, gen uint64, e kvwatch.Entry) {
	s.m.timerChanges.Inc()
	key, agentLen, shard, ok := s.layout.Parse(e.Key)
	if !ok {
		return
	}
	if s.skip(e.Again, shard) {
		return
	}
	if e.Deleted {
		s.removed(false, key, agentLen, shard, gen)
		return
	}
	var t timers.Timer
	if err := s.decode(key, e.Value, &t, func() (string, string) { return t.AgentID, t.ID }); err != nil {
		s.refuse(bucket, e.Key, err)
		s.removed(false, key, agentLen, shard, gen)
		return
	}
	if t.Finished() {
		s.removed(false, key, agentLen, shard, gen)
		return
	}
	if s.timers != nil {
		s.timers.set(key, agentLen, true)
	}
	if !s.holds(shard) {
		return // another replica's: counted, not kept (a gain replays it)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.current(shard, gen) {
		return // dropped meanwhile
	}
	en := s.entryFor(false, key, agentLen, shard)
	en.summary = t.Summary
	en.interval = t.Interval()
	en.cal = timers.CalendarFor(&t, en.cal)
	if en.cal == nil && t.IsCalendar() {
		// A schedule that no longer compiles (a zone gone from the tz
		// database): kept and counted, never fired as something else.
		s.index.disarm(en)
		return
	}
	due, fires := timers.Due(&t)
	if !fires {
		en.awaiting = false
		s.index.disarm(en) // kept and counted, but not fired
		return
	}
	next := t.FireCount + 1
	if en.fired >= next {
		// We published past this record already; its update is on the way.
		return
	}
	if en.occ == next && en.due == due.UnixNano() && en.pos >= 0 {
		return // armed as the record says, maybe backing off a retry: keep it
	}
	en.occ = next
	s.armAt(en, due.UnixNano())
}

// decode reads a record strictly: it must decode, and name the agent and
// ID its key does. Only chime writes these buckets; a record that fails
// is not chime's, and firing it would act on whatever it claims.
func (s *Scheduler) decode(key string, value []byte, rec any, names func() (agentID, id string)) error {
	if err := json.Unmarshal(value, rec); err != nil {
		return err
	}
	agentID, id, _ := subjects.ParseRecordKey(key)
	if a, i := names(); a != agentID || i != id {
		return fmt.Errorf("the record names agent %q and ID %q", a, i)
	}
	return nil
}

// refuse counts and logs a record passed over, at most one line per
// refusedLogInterval: a flood of them must not flood the log.
func (s *Scheduler) refuse(bucket, key string, err error) {
	s.m.refused.WithLabelValues(bucket).Inc()
	s.refusedLog.Do(1, func(n int64) {
		s.log.Error("records passed over: they are not ones chime wrote", "bucket", bucket, "key", key, "err", err, "records", n)
	})
}

// refusedLogInterval paces the log of records passed over.
const refusedLogInterval = 10 * time.Second

// applyWait folds one wait record change into the index, as applyTimer.
func (s *Scheduler) applyWait(bucket string, gen uint64, e kvwatch.Entry) {
	s.m.waitChanges.Inc()
	key, agentLen, shard, ok := s.layout.Parse(e.Key)
	if !ok {
		return
	}
	if s.skip(e.Again, shard) {
		return
	}
	if e.Deleted {
		s.removed(true, key, agentLen, shard, gen)
		return
	}
	var w waits.Wait
	if err := s.decode(key, e.Value, &w, func() (string, string) { return w.AgentID, w.ID }); err != nil {
		s.refuse(bucket, e.Key, err)
		s.removed(true, key, agentLen, shard, gen)
		return
	}
	if w.Status != waits.WaitWaiting {
		s.removed(true, key, agentLen, shard, gen)
		return
	}
	if s.waits != nil {
		s.waits.set(key, agentLen, true)
	}
	if !s.holds(shard) {
		return // as in applyTimer
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.current(shard, gen) {
		return
	}
	en := s.entryFor(true, key, agentLen, shard)
	en.rev = e.Revision
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
	if en.due == due && en.pos >= 0 {
		return // armed for this target, maybe backing off a retry
	}
	s.armAt(en, due)
}
