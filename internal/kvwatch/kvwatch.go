// Package kvwatch keeps a replica's live view of a JetStream KV bucket:
// the one watch loop chime runs, with one failure policy, under every
// in-memory index (timers, waits, triggers, agents).
//
// nats.go's KV watcher rides on an ordered push consumer whose missed
// heartbeats are noticed after 10-15 s and whose re-creation backs off to
// 10 s: after a stream leader change, measured, replicas fired timers 14 s
// after their cancel. This loop pulls from its own ephemeral consumer with
// a short heartbeat instead: a silent or lost consumer is noticed within
// about two heartbeats and re-created from the next revision at once (then
// with capped, jittered backoff), a re-created bucket (its sequence went
// backwards) is reloaded whole, and the view says whether it is live, so
// its users can stop trusting it rather than act on stale state.
package kvwatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/chime-nats/chime/internal/backoff"
	"github.com/chime-nats/chime/internal/pacer"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Entry is one change of a key, in revision order.
type Entry struct {
	Key      string
	Value    []byte
	Revision uint64
	Deleted  bool // deleted or purged
	// Again says this revision was applied before: a replay delivers it
	// once more. A view whose state already holds it may skip it.
	Again bool
}

// Config configures a Watch.
type Config struct {
	JS     jetstream.JetStream
	Bucket string
	// Keys, when set, is a key pattern ("idx.>"): only those keys are
	// watched, and Seen counts their revisions alone.
	Keys string
	// Apply folds one change into the view; it is called from one
	// goroutine, in revision order.
	Apply func(Entry)
	// Reset, when set, is called before the bucket is reloaded from
	// scratch because it was deleted and created anew: the view must
	// forget what it has.
	Reset func()
	// Heartbeat is how often an idle consumer proves it is alive; a
	// consumer silent for two heartbeats is re-created. Default and least
	// 500 ms (nats.go's floor).
	Heartbeat time.Duration
	Log       *slog.Logger
}

// Watch keeps one bucket's view. Start it once; Stop is idempotent and
// safe without Start.
type Watch struct {
	cfg    Config
	log    *slog.Logger
	stream string
	prefix string

	loaded     chan struct{}
	loadedOnce sync.Once

	mu      sync.Mutex
	changed *sync.Cond
	seen    uint64 // highest revision applied
	live    bool   // a consumer is delivering
	problem string // why it is not live
	stopped bool
	// epoch is the connection's reconnect count when the consumer was
	// made. The consumer acks nothing, so what the server pushed into a
	// connection that then broke is lost without a gap showing until the
	// next change: a consumer older than the last reconnect is not
	// trusted, and is made anew from the next revision.
	epoch uint64

	// A replay delivers every key's current value again (Replay).
	// replaying is closed when the replay in progress has caught up;
	// queued, when set, is the next one, started after it. stopConsumer
	// ends the running consumer so that a replay starts now.
	replaying, queued chan struct{}
	stopConsumer      func()

	// lastGap is the consumer-sequence gap the previous consumer stopped
	// at; the same gap again is deliveries the client library drops
	// (statusShaped), not changes lost in transit. Only the loop uses it.
	lastGap gap
	// skipLog paces the log of status-shaped messages passed over.
	skipLog *pacer.Pacer
	// lagLog paces the log of consumers placed again off a lagging copy.
	lagLog *pacer.Pacer
	// offLeader counts the placement rounds in a row that found no
	// consumer on the stream's leader. Only the loop uses it.
	offLeader int
	// probing holds off a second probe while one runs: many waiters
	// stuck behind a lagging watch must not each read the stream.
	probing atomic.Bool

	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// gap is where a consumer saw deliveries go missing: resuming from next,
// after delivered, the next delivery was consumer sequence to, stream
// sequence at.
type gap struct{ next, delivered, to, at uint64 }

// New returns a Watch; Start begins it.
func New(c Config) *Watch {
	c.Heartbeat = min(max(c.Heartbeat, 500*time.Millisecond), 30*time.Second)
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	w := &Watch{
		cfg: c, log: c.Log.With("component", "kvwatch", "bucket", c.Bucket, "keys", c.Keys),
		stream: "KV_" + c.Bucket, prefix: "$KV." + c.Bucket + ".",
		loaded: make(chan struct{}), problem: "not started", done: make(chan struct{}),
	}
	w.changed = sync.NewCond(&w.mu)
	w.skipLog = pacer.New(10 * time.Second)
	w.lagLog = pacer.New(10 * time.Second)
	return w
}

// Start begins watching in the background; it does not block: a view
// decides for itself when it needs the bucket's current values, which
// Loaded tells. The watch runs under ctx, until Stop.
func (w *Watch) Start(ctx context.Context) error {
	ctx, w.cancel = context.WithCancel(ctx)
	go func() {
		defer close(w.done)
		w.run(ctx)
	}()
	return nil
}

// StartLoaded starts the watch (it then runs until Stop, whatever ctx
// does) and returns once the bucket's current values are applied; ctx
// bounds only that wait, and a watch not loaded by then is stopped.
func (w *Watch) StartLoaded(ctx context.Context) error {
	if err := w.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	select {
	case <-w.loaded:
		return nil
	case <-ctx.Done():
		_ = w.Stop(ctx)
		return fmt.Errorf("kvwatch: loading %s: %w", w.cfg.Bucket, ctx.Err())
	}
}

// Stop ends the watch and waits for its loop, which ends at once. It is
// idempotent and safe without Start.
func (w *Watch) Stop(context.Context) error {
	w.once.Do(func() {
		w.mu.Lock()
		w.stopped = true
		w.live, w.problem = false, "stopped"
		w.changed.Broadcast()
		w.mu.Unlock()
		if w.cancel == nil {
			return
		}
		w.cancel()
		<-w.done
	})
	return nil
}

// Bucket is the watched bucket's name.
func (w *Watch) Bucket() string { return w.cfg.Bucket }

// Loaded is closed once every value the bucket held at start is applied.
func (w *Watch) Loaded() <-chan struct{} { return w.loaded }

// Live reports whether a consumer is delivering changes, and if not, why.
// While the connection is down nothing can be, whatever the consumer
// thinks (nats.go stops the heartbeat clock while disconnected).
func (w *Watch) Live() (bool, string) {
	nc := w.cfg.JS.Conn()
	if !nc.IsConnected() {
		return false, "disconnected from NATS"
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.live && nc.Stats().Reconnects != w.epoch {
		return false, "reconnected; resuming"
	}
	return w.live, w.problem
}

// AllLive reports whether every one of ws is live, and if not, which is
// not and why.
func AllLive(ws ...*Watch) (bool, string) {
	for _, w := range ws {
		if live, why := w.Live(); !live {
			return false, "watch of " + w.Bucket() + ": " + why
		}
	}
	return true, ""
}

// Replay has the watch deliver every key's current value again, marked
// Again where the revision was applied before, and then go on with
// changes as before: a view that starts keeping keys it skipped loads
// them this way. The returned channel is closed once the replay has
// caught up with the bucket. A replay asked for while one runs is queued
// behind it (one queued replay serves every such request), so steady
// requests never starve a replay of completion.
func (w *Watch) Replay() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.queued != nil {
		return w.queued
	}
	w.queued = make(chan struct{})
	if w.replaying == nil && w.stopConsumer != nil {
		w.stopConsumer()
	}
	return w.queued
}

// startReplay moves a queued replay in progress; it reports whether one
// was queued.
func (w *Watch) startReplay() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.queued == nil || w.replaying != nil {
		return false
	}
	w.replaying, w.queued = w.queued, nil
	return true
}

// caughtUp marks the initial load and any replay in progress complete.
// A queued replay then stops the consumer to start.
func (w *Watch) caughtUp() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.caughtUpLocked()
}

// caughtUpLocked is caughtUp with w.mu held.
func (w *Watch) caughtUpLocked() {
	w.markLoaded()
	if w.replaying != nil {
		close(w.replaying)
		w.replaying = nil
		if w.queued != nil && w.stopConsumer != nil {
			w.stopConsumer()
		}
	}
}

// Seen is the highest revision applied.
func (w *Watch) Seen() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen
}

// ErrStopped is returned to waiters of a stopped watch.
var ErrStopped = errors.New("kvwatch: stopped")

// WaitSeen blocks until revision rev is applied, ctx ends or the watch
// stops.
func (w *Watch) WaitSeen(ctx context.Context, rev uint64) error {
	if w.Seen() >= rev {
		return nil
	}
	stop := context.AfterFunc(ctx, func() {
		w.mu.Lock()
		w.changed.Broadcast()
		w.mu.Unlock()
	})
	defer stop()
	// A waiter still behind after a while may be behind messages the
	// consumer never surfaces: look at them (probe), every probeAfter
	// while it waits.
	done := make(chan struct{})
	defer close(done)
	go func() {
		t := time.NewTicker(probeAfter)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				w.probe(ctx, rev)
			}
		}
	}()
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.seen < rev {
		if w.stopped {
			return ErrStopped
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("kvwatch: %s behind revision %d (%s): %w", w.cfg.Bucket, rev, w.problem, err)
		}
		w.changed.Wait()
	}
	return nil
}

// probeAfter is how long a waiter waits before its revisions are looked
// at directly, and maxProbe how many it looks at: more than that behind
// is a watch lagging, not one stuck behind dropped messages.
const (
	probeAfter = time.Second
	maxProbe   = 64
)

// probe reads the revisions after the last applied up to rev from the
// stream itself: when none of them is a change the watch will deliver
// (gone, outside its keys, or status-shaped: dropped by the client
// library), they are passed over and the waiter released. Any other
// message among them is still to come, and the waiter waits for it.
func (w *Watch) probe(ctx context.Context, rev uint64) {
	if !w.probing.CompareAndSwap(false, true) {
		return
	}
	defer w.probing.Store(false)
	w.mu.Lock()
	from, live := w.seen+1, w.live
	w.mu.Unlock()
	if !live || rev < from || rev-from >= maxProbe {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	dropped, found := w.lookAt(ctx, from, rev)
	if found != noChange {
		return
	}
	w.mu.Lock()
	if w.live && w.seen < rev {
		w.seen = rev
		w.changed.Broadcast()
	}
	w.mu.Unlock()
	w.passOver(dropped, "status-shaped messages last in the bucket")
}

// What lookAt found among the stream's messages.
const (
	noChange    = iota // none is a change the watch delivers
	changeFound        // at least one is
	notLookedAt        // too many to look at, or the stream did not answer
)

// lookAt reads the stream's messages from sequence from to to (at most
// maxProbe) and says whether any is a change the watch delivers, not one
// gone, outside its keys or status-shaped (dropped by the client
// library); it counts the status-shaped ones.
func (w *Watch) lookAt(ctx context.Context, from, to uint64) (dropped int64, found int) {
	if to < from {
		return 0, noChange
	}
	if to-from >= maxProbe {
		return 0, notLookedAt
	}
	st, err := w.cfg.JS.Stream(ctx, w.stream)
	if err != nil {
		return 0, notLookedAt
	}
	for seq := from; seq <= to; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return 0, notLookedAt
		}
		if !w.watches(m.Subject) {
			continue
		}
		if !statusShaped(m.Header, m.Data) {
			return 0, changeFound
		}
		dropped++
	}
	return dropped, noChange
}

// statusShaped is a message the client library takes for a server
// status and drops: no body, a Status header. No KV client writes one; a
// JetStream reply (a pull's "404 No Messages") aimed into the bucket does.
func statusShaped(h nats.Header, data []byte) bool {
	return len(data) == 0 && h.Get("Status") != ""
}

// watches reports whether subject is one of the watched keys'.
func (w *Watch) watches(subject string) bool {
	key, ok := strings.CutPrefix(subject, w.prefix)
	if !ok {
		return false
	}
	filter := cmp.Or(w.cfg.Keys, ">")
	ft, kt := strings.Split(filter, "."), strings.Split(key, ".")
	for i, f := range ft {
		switch {
		case f == ">":
			return len(kt) > i
		case i >= len(kt):
			return false
		case f != "*" && f != kt[i]:
			return false
		}
	}
	return len(kt) == len(ft)
}

// passOver counts and logs, at most once per interval, messages the watch
// never applies because the client library dropped them.
func (w *Watch) passOver(n int64, why string) {
	if n <= 0 {
		return
	}
	w.skipLog.Do(n, func(count int64) {
		w.log.Warn("passed over messages in the bucket that are no change: a JetStream reply was aimed into it", "why", why, "messages", count)
	})
}

func (w *Watch) setLive(live bool, problem string) {
	w.mu.Lock()
	was := w.live
	w.live, w.problem = live, problem
	w.changed.Broadcast()
	w.mu.Unlock()
	if was && !live {
		w.log.Warn("watch lost; re-creating", "reason", problem)
	} else if !was && live && problem == "" {
		w.log.Debug("watch live")
	}
}

// recreate paces the re-creation of a failing consumer; a failure after a
// consumer that delivered is retried at once.
var recreate = backoff.Policy{Min: 50 * time.Millisecond, Max: time.Second}

// run keeps a consumer delivering until ctx ends.
func (w *Watch) run(ctx context.Context) {
	var next uint64 // the revision to resume from; 0: load current values
	fails := 0      // consecutive failures without progress
	for ctx.Err() == nil {
		// Jitter keeps replicas from re-creating in lockstep.
		if fails > 0 && !recreate.Sleep(ctx, fails-1) {
			return
		}
		if w.startReplay() {
			next, fails = 0, 0
		}
		resumed, err := w.consume(ctx, next)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errReplay) {
			next, fails = resumed, 0 // resumed, or 0 once startReplay takes it
			continue
		}
		if resumed > next {
			next, fails = resumed, 0 // it worked for a while: retry at once
		}
		if errors.Is(err, errRecreated) {
			next, fails = 0, 0
			continue
		}
		w.setLive(false, err.Error())
		fails++
	}
}

var (
	errRecreated = errors.New("bucket re-created")
	errReplay    = errors.New("replay asked for")
	errLagging   = errors.New("consumer placed on a copy of the bucket that is behind its leader")
	errNoLeader  = errors.New("the bucket's stream has no leader")
	errOffLeader = errors.New("no consumer placed on the stream's leader")
)

// A watch creates up to placeTries consumers in one round in search of one
// on its stream's leader; after offLeaderRounds rounds in a row without,
// it takes one on a copy its leader counts current.
const (
	placeTries      = 20
	offLeaderRounds = 5
)

// place creates the watch's consumer on the server that leads the
// bucket's stream. The server places an R1 consumer on any copy, and a
// copy may lack records while it catches up: one back from a partition
// can be fed the missed messages out of band, which its consumers never
// deliver, and its leader counts it current meanwhile (its log is, its
// store is not). A shard loaded from such a copy never fired the records
// stored while the server was away (measured: timers 61 s late, waits
// 78 s late, until the shard moved). The leader holds every record it
// acknowledged. Each placement elsewhere is deleted and made again; a
// stream with no leader (an election) places nothing (errNoLeader), and a
// round that finds no consumer on the leader is errOffLeader: the watch
// retries after its backoff, with the stream's leader asked again. Only
// after offLeaderRounds such rounds, in case the server never places one
// there, is a copy its leader counts current taken (one it does not is
// errLagging).
func (w *Watch) place(ctx context.Context, stream jetstream.Stream, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	leader := stream.CachedInfo().Cluster
	if leader != nil && leader.Leader == "" && len(leader.Replicas) > 0 {
		return nil, fmt.Errorf("%w: %s", errNoLeader, w.stream)
	}
	for try := 1; ; try++ {
		cons, err := stream.CreateConsumer(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("create consumer: %w", err)
		}
		on := cons.CachedInfo().Cluster
		if leader == nil || on == nil || on.Leader == "" || on.Leader == leader.Leader {
			w.offLeader = 0
			return cons, nil
		}
		if try < placeTries {
			w.deleteConsumer(ctx, cons.CachedInfo().Name)
			continue
		}
		if w.offLeader++; w.offLeader < offLeaderRounds {
			w.deleteConsumer(ctx, cons.CachedInfo().Name)
			return nil, fmt.Errorf("%w: %d consumers of %s, none on %s", errOffLeader, placeTries, w.stream, leader.Leader)
		}
		peer := lagging(leader, on)
		if peer == "" {
			w.log.Warn("watch consumer on a copy, not on the stream's leader", "server", on.Leader, "leader", leader.Leader)
			return cons, nil
		}
		w.deleteConsumer(ctx, cons.CachedInfo().Name)
		w.lagLog.Do(1, func(n int64) {
			w.log.Info("watch consumer placed on a lagging copy; placing it again", "server", peer, "times", n)
		})
		return nil, fmt.Errorf("%w: on %s", errLagging, peer)
	}
}

// deleteConsumer removes a consumer of the watch's. An abandoned one would
// linger for its InactiveThreshold; with NATS away there is no one to
// tell, and it expires by itself.
func (w *Watch) deleteConsumer(ctx context.Context, name string) {
	if !w.cfg.JS.Conn().IsConnected() {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_ = w.cfg.JS.DeleteConsumer(dctx, w.stream, name)
}

// lagging names the server of a consumer (cons) that holds a copy of its
// stream (stream: the stream's leader's view) that is not current, or ""
// when it is current, the leader itself, or not clustered.
func lagging(stream, cons *jetstream.ClusterInfo) string {
	if stream == nil || cons == nil || cons.Leader == "" || cons.Leader == stream.Leader {
		return ""
	}
	for _, p := range stream.Replicas {
		if p.Name == cons.Leader && !p.Current {
			return p.Name
		}
	}
	return ""
}

// consume runs one consumer from revision next (0: the current values)
// until it fails; it returns the revision to resume from.
func (w *Watch) consume(ctx context.Context, next uint64) (uint64, error) {
	resumedFrom := next
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	nc := w.cfg.JS.Conn()
	epoch := nc.Stats().Reconnects
	stream, err := w.cfg.JS.Stream(cctx, w.stream)
	if err != nil {
		return next, fmt.Errorf("stream %s: %w", w.stream, err)
	}
	if next > 0 && stream.CachedInfo().State.LastSeq+1 < next {
		// The sequence went backwards: the bucket was deleted and made
		// anew. What the view holds is gone; load it again.
		w.log.Warn("bucket re-created; reloading", "last_seq", stream.CachedInfo().State.LastSeq, "resume", next)
		if w.cfg.Reset != nil {
			w.cfg.Reset()
		}
		w.mu.Lock()
		w.seen = 0
		w.mu.Unlock()
		return 0, errRecreated
	}
	cfg := jetstream.ConsumerConfig{
		AckPolicy:         jetstream.AckNonePolicy,
		FilterSubject:     w.prefix + cmp.Or(w.cfg.Keys, ">"),
		MemoryStorage:     true,
		Replicas:          1,
		InactiveThreshold: time.Minute,
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
	}
	if next > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, next
	}
	cons, err := w.place(cctx, stream, cfg)
	if err != nil {
		return next, err
	}
	name := cons.CachedInfo().Name
	defer w.deleteConsumer(ctx, name)
	if cons.CachedInfo().NumPending == 0 {
		w.caughtUp() // nothing to load, or nothing left after a failure mid-load
	}
	it, err := cons.Messages(
		jetstream.PullMaxMessages(512),
		// Short pulls: a pull that finds the consumer's server gone comes
		// back "no responders" at once, so a lost consumer is noticed
		// within a pull's expiry even when heartbeats are slow to be missed.
		jetstream.PullExpiry(max(2*w.cfg.Heartbeat, time.Second)),
		jetstream.PullHeartbeat(w.cfg.Heartbeat),
		jetstream.WithMessagesErrOnMissingHeartbeat(true),
	)
	if err != nil {
		return next, fmt.Errorf("consume: %w", err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	var replay atomic.Bool
	w.mu.Lock()
	w.epoch = epoch
	w.stopConsumer = func() { replay.Store(true); it.Stop() }
	queued := w.queued != nil && w.replaying == nil
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.stopConsumer = nil
		w.mu.Unlock()
	}()
	if queued {
		return next, errReplay // asked for while this consumer was being made
	}
	w.setLive(true, "")
	// After a reconnect this consumer may have lost changes in flight:
	// stop it, and the loop makes a new one from the next revision.
	reconnected := make(chan struct{})
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-reconnected:
				return
			case <-t.C:
				if nc.Stats().Reconnects != epoch {
					it.Stop()
					return
				}
			}
		}
	}()
	defer close(reconnected)
	var delivered uint64
	// after is the revision the deliveries so far reach (the last applied,
	// or before the first this consumer can deliver); look, what the last
	// look at a quiet consumer found (settle).
	after := max(next, stream.CachedInfo().State.FirstSeq, 1) - 1
	var look quietLook
	for {
		m, err := w.next(it)
		if errors.Is(err, nats.ErrTimeout) {
			if err := w.settle(ctx, cons, delivered, after, &look); err != nil {
				return next, err
			}
			continue
		}
		look.idle = 0
		if err != nil {
			if replay.Load() {
				return next, errReplay
			}
			if nc.Stats().Reconnects != epoch {
				return next, errors.New("reconnected to NATS")
			}
			return next, fmt.Errorf("next: %w", err)
		}
		md, err := m.Metadata()
		if err != nil {
			return next, fmt.Errorf("metadata: %w", err)
		}
		if md.Sequence.Consumer != delivered+1 {
			// A gap: deliveries went missing. Resume from what we have,
			// unless the previous consumer stopped at this very gap:
			// then the client library drops them every time, as it drops
			// a message it takes for a server status (statusShaped).
			// Changes lost in transit do not go missing twice alike.
			g := gap{next: resumedFrom, delivered: delivered, to: md.Sequence.Consumer, at: md.Sequence.Stream}
			if g != w.lastGap || md.Sequence.Consumer < delivered {
				w.lastGap = g
				return next, fmt.Errorf("consumer sequence %d after %d", md.Sequence.Consumer, delivered)
			}
			w.passOver(int64(md.Sequence.Consumer-delivered-1), "a repeated gap in the deliveries")
		}
		delivered = md.Sequence.Consumer
		e := Entry{
			Key:      strings.TrimPrefix(m.Subject(), w.prefix),
			Value:    m.Data(),
			Revision: md.Sequence.Stream,
			Deleted:  deleted(m.Headers()),
		}
		// Only this loop writes seen, so it may read it without the lock.
		e.Again = e.Revision <= w.seen
		w.cfg.Apply(e)
		next, after = e.Revision+1, e.Revision
		w.mu.Lock()
		w.seen = max(w.seen, e.Revision)
		w.changed.Broadcast()
		if md.NumPending == 0 {
			w.caughtUpLocked()
		}
		w.mu.Unlock()
	}
}

// next waits for the consumer's next message. While the watch loads or
// replays it waits at most a heartbeat (then nats.ErrTimeout), so that a
// quiet consumer is looked at (settle): the pending count a delivery
// carries, which says when the watch has caught up, can stay above zero
// after the last one. A live watch waits longer (liveLooks) before it
// looks.
func (w *Watch) next(it jetstream.MessagesContext) (jetstream.Msg, error) {
	w.mu.Lock()
	catching := w.replaying != nil
	w.mu.Unlock()
	select {
	case <-w.loaded:
	default:
		catching = true
	}
	if catching {
		return it.Next(jetstream.NextMaxWait(w.cfg.Heartbeat))
	}
	return it.Next(jetstream.NextMaxWait(max(liveLooks*w.cfg.Heartbeat, liveLookMin)))
}

// A live watch quiet for liveLooks heartbeats (at least liveLookMin) is
// looked at too: a consumer can stop delivering while its server still
// counts messages pending for it and answers its pulls with heartbeats
// (measured after a heal: a shard's timers 31 s late, until a replay
// happened to look). Two looks find it; a quiet bucket costs one consumer
// info per look.
const (
	liveLooks   = 4
	liveLookMin = 2 * time.Second
)

// quietLook is what settle found at its last look at a quiet consumer.
type quietLook struct {
	// missing is the server's count of deliveries when some had not
	// reached the watch.
	missing uint64
	// idle is one more than the server's count of deliveries when it
	// counted messages pending for the consumer; 0 when it did not, or
	// when a delivery arrived since.
	idle uint64
}

// settle looks at a consumer gone quiet (see next), having applied
// delivered deliveries, which reach revision after. The
// server's running count of pending messages can stay above zero after
// the last delivery (a message replaced while the consumer passed over
// it; measured under load: a replay then waited for the bucket's next
// change, and the shards a replica had gained never fired), and the
// client library drops a status-shaped message after the server counted
// it. Asked, the server counts again: nothing pending and every delivery
// applied is caught up. Deliveries that never reached the watch are
// looked at in the stream: none that is a change is caught up too; a
// change still missing at the next look was lost, and the consumer is
// made anew from the next revision. The question stands in for the
// heartbeats, which a short wait does not watch (nats.go watches them
// only within one wait, and the wait ends first): no answer in time fails
// the consumer as missed heartbeats would, and so does a consumer the
// server counts messages pending for and delivered none of since the
// last look, a heartbeat or more before (its pull is gone: in chime-bench
// chaos a shard's load stayed at 13 pending, 0 delivered while a server
// of the cluster restarted, and the shard, held, never fired).
func (w *Watch) settle(ctx context.Context, cons jetstream.Consumer, delivered, after uint64, look *quietLook) error {
	ctx, cancel := context.WithTimeout(ctx, max(2*w.cfg.Heartbeat, 2*time.Second))
	defer cancel()
	info, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("consumer info: %w", err)
	}
	if info.NumPending > 0 {
		if look.idle == info.Delivered.Consumer+1 {
			return fmt.Errorf("%d messages pending and none delivered since the last look", info.NumPending)
		}
		look.idle = info.Delivered.Consumer + 1
		return nil
	}
	look.idle = 0
	if info.Delivered.Consumer > delivered {
		dropped, found := w.lookAt(ctx, after+1, info.Delivered.Stream)
		switch {
		case found == changeFound && look.missing == info.Delivered.Consumer:
			return fmt.Errorf("deliveries %d to %d never arrived", delivered+1, info.Delivered.Consumer)
		case found != noChange:
			look.missing = info.Delivered.Consumer // in flight, or lost: look again
			return nil
		}
		w.passOver(dropped, "status-shaped messages last in the bucket")
	}
	w.caughtUp()
	return nil
}

// deleted reports whether a bucket message removes its key: a client's
// delete or purge, or the marker the server leaves when a revision's TTL
// (or the bucket's max age) ran out, which carries no KV-Operation and no
// value.
func deleted(h nats.Header) bool {
	op := h.Get("KV-Operation")
	return op == "DEL" || op == "PURGE" || h.Get(jetstream.MarkerReasonHeader) != ""
}

func (w *Watch) markLoaded() {
	w.loadedOnce.Do(func() { close(w.loaded) })
}
