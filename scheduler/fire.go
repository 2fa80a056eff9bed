package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/backoff"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waits"
)

// An occurrence's life: popped when due, published once (a timer's inbox
// envelope, a wait's wait.fire event), and done only when that publish is
// acknowledged. A failed or unacknowledged publish re-arms the very same
// occurrence (same number, same due time, same message IDs) after a
// jittered backoff, so a retry can never become a different delivery; a
// timer's record is updated only after its envelope is stored, behind the
// latency path.

// pendingFire is a published fire awaiting its ack.
type pendingFire struct {
	ack   jetstream.PubAckFuture
	err   error // the publish failed to start
	wait  bool
	key   string
	occ   int64
	due   int64
	timer timers.TimerFired // the record update of a timer fire
}

// publishFunc sends one pass's fires; fireLoop takes it as a parameter so
// the loop's timing can be tested without a server.
type publishFunc func(ctx context.Context, timerFires []timers.TimerFired, waitFires []waits.WaitFired)

// fireLoop pops what is due in the shards this replica may fire (owned by
// a valid lease, loaded, watched live), hands it to publish, and sleeps
// until the next due time or a wake.
func (s *Scheduler) fireLoop(ctx context.Context, publish publishFunc) {
	owned := make([]bool, s.cfg.Shards)
	batch := make([]*entry, 0, s.cfg.BatchSize)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := s.cfg.Now()
		s.cfg.Leases.Owned(now, owned)
		s.fireable(owned)
		// A stale index may still hold what was cancelled: fire nothing
		// of a shard until its watches are live again (leases go at the
		// next lease round).
		live := s.liveOnly(owned)
		s.mu.Lock()
		batch = s.index.popDue(owned, now.UnixNano(), s.cfg.BatchSize, batch[:0])
		timerFires, waitFires := s.prepare(batch, now)
		next, armed := s.index.next(owned)
		s.mu.Unlock()
		publish(ctx, timerFires, waitFires)
		if ctx.Err() != nil {
			return
		}
		if len(batch) == s.cfg.BatchSize {
			continue
		}
		wait := time.Hour
		if armed {
			wait = time.Duration(next - s.cfg.Now().UnixNano())
		}
		if !live {
			wait = min(wait, 50*time.Millisecond) // look again soon
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

// prepare marks each popped entry as fired and returns the timer and wait
// fires. A repeating timer is re-armed at its next occurrence, chosen now
// (or, for a retry, when the occurrence was first prepared) and carried in
// the fire, so its envelope and its record say the same. Called with s.mu
// held.
func (s *Scheduler) prepare(batch []*entry, now time.Time) ([]timers.TimerFired, []waits.WaitFired) {
	timerFires := make([]timers.TimerFired, 0, len(batch))
	var waitFires []waits.WaitFired
	for _, en := range batch {
		if en.cal != nil {
			if f, fire := s.prepareCalendar(en, now); fire {
				timerFires = append(timerFires, f)
			}
			continue
		}
		due := time.Unix(0, en.due).UTC()
		if en.attempts == 0 {
			s.m.lateness.Observe(now.Sub(due).Seconds())
		}
		if en.wait {
			waitFires = append(waitFires, waits.WaitFired{AgentID: en.agentID(), WaitID: en.itemID(), Target: due, FiredAt: now.UTC(), Rev: en.rev})
			en.fired = en.due
			continue
		}
		f := timers.TimerFired{
			AgentID: en.agentID(), TimerID: en.itemID(), Occurrence: en.occ,
			DueAt: due, FiredAt: now.UTC(), Text: (&timers.Timer{ID: en.itemID(), Summary: en.summary}).FireText(),
		}
		retry := en.retry
		en.retry = nil
		en.fired = en.occ
		if en.interval > 0 {
			next := timers.NextOccurrence(due, en.interval, now).UTC()
			if retry != nil && retry.NextDue != nil && retry.Occurrence == en.occ && retry.DueAt.UnixNano() == en.due {
				next = *retry.NextDue // a retry keeps the cadence its first attempt stated
			}
			f.NextDue = &next
			en.occ++
			en.due, en.at, en.attempts = next.UnixNano(), next.UnixNano(), 0
			en.awaiting = true // armed once this fire settles (settled)
		}
		timerFires = append(timerFires, f)
	}
	return timerFires, waitFires
}

// publish is the fire loop's publishFunc: fires whose envelope is
// already stored go to their record update, the others out.
func (s *Scheduler) publish(ctx context.Context, timerFires []timers.TimerFired, waitFires []waits.WaitFired) {
	s.publishTimers(ctx, s.dropDelivered(ctx, timerFires))
	s.publishWaits(ctx, waitFires)
}

// dropDelivered takes out of fires those whose envelope the inbox already
// holds although the dedup window has forgotten it (an owner crashed
// between publish and record update, then downtime outlasted the window):
// they go straight to their record update. Only fires older than the
// window are looked up, one search per agent.
func (s *Scheduler) dropDelivered(ctx context.Context, fires []timers.TimerFired) []timers.TimerFired {
	if s.cfg.Inbox == nil {
		return fires
	}
	suspect := make([]bool, len(fires))
	since := map[string]time.Time{} // per agent, the oldest suspect due time
	for i := range fires {
		f := &fires[i]
		if suspect[i] = s.cfg.Inbox.Suspect(f.DueAt); !suspect[i] {
			continue
		}
		if t, ok := since[f.AgentID]; !ok || f.DueAt.Before(t) {
			since[f.AgentID] = f.DueAt
		}
	}
	if len(since) == 0 {
		return fires
	}
	found := make(map[string]map[string]uint64, len(since))
	failed := map[string]error{}
	for agent, t := range since {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		found[agent], failed[agent] = s.cfg.Inbox.Delivered(sctx, agent, t)
		cancel()
	}
	kept := fires[:0]
	for i, f := range fires {
		switch {
		case !suspect[i]:
			kept = append(kept, f)
		case failed[f.AgentID] != nil:
			s.rearm(pendingFire{key: subjects.TimerKey(f.AgentID, f.TimerID), occ: f.Occurrence, due: f.DueAt.UnixNano(), timer: f},
				fmt.Errorf("look for an earlier delivery: %w", failed[f.AgentID]))
		case found[f.AgentID][f.EnvelopeID()] != 0:
			s.m.recovered.Inc()
			key := subjects.TimerKey(f.AgentID, f.TimerID)
			if f.NextDue != nil {
				// Stored before the downtime: its cadence goes on from
				// the stored envelope's next_due_at, as a duplicate's.
				s.adoptStored(ctx, pendingFire{key: key, occ: f.Occurrence, due: f.DueAt.UnixNano(), timer: f}, found[f.AgentID][f.EnvelopeID()])
				continue
			}
			s.settled(key, f.Occurrence, 0, 0)
			s.queueRecord(f)
		default:
			kept = append(kept, f)
		}
	}
	return kept
}

// publishTimers sends the timer_fired envelopes, asynchronously: the one
// JetStream write between a due time and the agent.
func (s *Scheduler) publishTimers(ctx context.Context, fires []timers.TimerFired) {
	for i := range fires {
		f := &fires[i]
		p := pendingFire{key: subjects.TimerKey(f.AgentID, f.TimerID), occ: f.Occurrence, due: f.DueAt.UnixNano(), timer: *f}
		p.ack, p.err = s.cfg.Inbox.DeliverAsync(timers.TimerFiredMsg(f))
		if !s.enqueue(ctx, p) {
			return
		}
	}
}

// publishWaits sends wait.fire events; the waits consumer decides, by CAS
// against cancellation, whether the wait completes, and delivers it.
func (s *Scheduler) publishWaits(ctx context.Context, fires []waits.WaitFired) {
	for i := range fires {
		f := &fires[i]
		p := pendingFire{wait: true, key: waits.WaitKey(f.AgentID, f.WaitID), occ: 1, due: f.Target.UnixNano()}
		data, err := json.Marshal(f)
		if err == nil {
			m := &nats.Msg{Subject: subjects.WaitFire, Data: data, Header: nats.Header{}}
			m.Header.Set(jetstream.MsgIDHeader, f.MsgID())
			p.ack, err = s.cfg.JS.PublishMsgAsync(m)
		}
		p.err = err
		if !s.enqueue(ctx, p) {
			return
		}
	}
}

func (s *Scheduler) enqueue(ctx context.Context, p pendingFire) bool {
	select {
	case s.pending <- p:
		return true
	case <-ctx.Done():
		return false
	}
}

// ackLoop settles published fires: a stored one is done (a timer's record
// update is queued), a failed one is re-armed.
func (s *Scheduler) ackLoop(ctx context.Context) {
	for {
		var p pendingFire
		select {
		case <-ctx.Done():
			return
		case p = <-s.pending:
		}
		err := p.err
		var ack *jetstream.PubAck
		if err == nil {
			ack, err = awaitAck(ctx, p.ack)
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.rearm(p, err)
			continue
		}
		s.health.success()
		if ack.Duplicate {
			s.m.duplicates.Inc()
		}
		if p.wait {
			continue
		}
		s.m.fires.Inc()
		s.cfg.Inbox.Stored(subjects.KindTimerFired, ack)
		if ack.Duplicate && p.timer.NextDue != nil {
			s.adoptStored(ctx, p, ack.Sequence)
			continue
		}
		s.settled(p.key, p.occ, 0, 0)
		s.queueRecord(p.timer)
	}
}

// settled arms the next occurrence of a repeating timer whose occurrence
// occ is stored, if it still awaits that: at the due time it was given
// (mine), or at next when the stored envelope states another (0: keep).
func (s *Scheduler) settled(key string, occ int64, mine, next int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	en, ok := s.index.table(false)[key]
	if !ok || !en.awaiting || en.occ != occ+1 || en.fired != occ {
		return // not repeating, re-armed from its record meanwhile, or gone
	}
	en.awaiting = false
	if next != 0 && en.due == mine {
		en.due, en.at = next, next
	}
	s.index.arm(en)
	s.Wake()
}

// adoptWorkers bound the stored envelopes read at once.
const adoptWorkers = 32

// adoption is a duplicate fire whose stored envelope is still to be read.
type adoption struct {
	p   pendingFire
	seq uint64
}

// adoptStored settles a repeating timer's fire that the stream took as a
// duplicate: the envelope stored under its ID may be another attempt's,
// by this replica before a lost ack or by an owner that has since lost
// the shard, with another next due time. The stored one is what the agent
// has, so the cadence goes on from it: the record takes its next_due_at,
// and the next occurrence, which awaits this settling unarmed, is armed at
// it (at once when it has passed: the catch-up fire of the ticks since).
// It queues the read for the adopt workers and never waits: a stream
// election may hold every read, and the ack loop must settle the other
// fires meanwhile. A stored envelope without next_due_at (an earlier
// version's) leaves this fire's own. One still unreadable after
// Config.AdoptLimit arms the next occurrence at the earliest next due time
// any attempt could have stated (one interval after the due time): the
// agent may have been told that one, and a catch-up fire at once covers it,
// where going on from this fire's later one would skip the ticks between
// silently.
func (s *Scheduler) adoptStored(_ context.Context, p pendingFire, seq uint64) {
	s.adoptions.push(adoption{p: p, seq: seq})
}

// adoptLoop is an adopt worker.
func (s *Scheduler) adoptLoop(ctx context.Context) {
	for {
		a, ok := s.adoptions.pop(ctx)
		if !ok {
			return
		}
		f := a.p.timer
		mine := f.NextDue.UnixNano()
		var next int64
		if stored, err := s.readStored(ctx, &f, a.seq); err != nil {
			if ctx.Err() != nil {
				return
			}
			if e := s.earliestNext(a.p.key, &f); e != 0 && e < mine {
				n := time.Unix(0, e).UTC()
				f.NextDue, next = &n, e
			}
			s.log.Warn("stored timer envelope unread; the next occurrence is armed at the earliest it may have named", "timer_id", f.TimerID, "occurrence", f.Occurrence, "err", err)
		} else if stored != nil && stored.NextDueAt != nil && !stored.NextDueAt.Equal(*f.NextDue) {
			s.m.adopted.Inc()
			n := stored.NextDueAt.UTC()
			f.NextDue, next = &n, n.UnixNano()
		}
		s.settled(a.p.key, a.p.occ, mine, next)
		s.queueRecord(f)
	}
}

// adoptQueue holds the adoptions still to read, unbounded: each is a
// repeating timer's one occurrence in flight.
type adoptQueue struct {
	mu    sync.Mutex
	items []adoption
	ready chan struct{} // one token while non-empty
}

func newAdoptQueue() *adoptQueue { return &adoptQueue{ready: make(chan struct{}, 1)} }

func (q *adoptQueue) push(a adoption) {
	q.mu.Lock()
	q.items = append(q.items, a)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// pop returns the oldest adoption, waiting for one; ok is false once ctx
// is done.
func (q *adoptQueue) pop(ctx context.Context) (a adoption, ok bool) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			a = q.items[0]
			q.items[0] = adoption{}
			q.items = q.items[1:]
			more := len(q.items) > 0
			if !more {
				q.items = nil // let the room go
			}
			q.mu.Unlock()
			if more {
				select {
				case q.ready <- struct{}{}:
				default:
				}
			}
			return a, true
		}
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return a, false
		case <-q.ready:
		}
	}
}

// earliestNext is the earliest next due time (unix ns) any attempt of
// fire f may have stated: one interval after its due time, for a timer
// on an interval; 0 when unknown (a calendar timer, or the entry gone).
func (s *Scheduler) earliestNext(key string, f *timers.TimerFired) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	en, ok := s.index.table(false)[key]
	if !ok || en.cal != nil || en.interval <= 0 {
		return 0
	}
	return f.DueAt.Add(en.interval).UnixNano()
}

// readStored returns the timer_fired data stored under f's ID, seq its
// sequence as a duplicate's ack named it; nil when f's own publish turned
// out to be the one stored. A duplicate of a publish still being
// replicated is acknowledged with sequence 0: f is then published again
// (the same message, absorbed) until the ack names the original.
func (s *Scheduler) readStored(ctx context.Context, f *timers.TimerFired, seq uint64) (*timers.TimerFiredData, error) {
	start := time.Now()
	for attempt := 0; ; attempt++ {
		var err error
		if seq == 0 {
			var fut jetstream.PubAckFuture
			if fut, err = s.cfg.Inbox.DeliverAsync(timers.TimerFiredMsg(f)); err == nil {
				var ack *jetstream.PubAck
				if ack, err = awaitAck(ctx, fut); err == nil {
					if !ack.Duplicate {
						return nil, nil // stored now: f is the envelope
					}
					seq = ack.Sequence
				}
			}
		}
		if seq != 0 {
			gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			var d *timers.TimerFiredData
			d, err = s.storedFire(gctx, seq)
			cancel()
			switch {
			case err == nil && d.TimerID == f.TimerID && d.Occurrence == f.Occurrence:
				return d, nil
			case err == nil:
				return nil, fmt.Errorf("inbox %d holds occurrence %d of %s", seq, d.Occurrence, d.TimerID)
			}
		}
		if ctx.Err() != nil || time.Since(start) > s.cfg.AdoptLimit {
			return nil, err
		}
		if !retries.Sleep(ctx, attempt) {
			return nil, ctx.Err()
		}
	}
}

// awaitAck waits for a publish ack. The JetStream context times an
// unacknowledged publish out itself (WithPublishAsyncTimeout), so every
// future settles; a timer per fire would cost a burst dearly.
func awaitAck(ctx context.Context, fut jetstream.PubAckFuture) (*jetstream.PubAck, error) {
	select {
	case ack := <-fut.Ok():
		return ack, nil
	case err := <-fut.Err():
		return nil, err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// retries paces the attempts of an occurrence, and of a record update:
// from 100 ms up to 2 s, so a stream back from an election is tried again
// within a second or two.
var retries = backoff.Policy{Min: 100 * time.Millisecond, Max: 2 * time.Second}

// rearm puts a failed fire's occurrence back in the index, same number and
// due time, to be published again after a backoff.
func (s *Scheduler) rearm(p pendingFire, cause error) {
	s.m.failures.Inc()
	s.health.failure(cause)
	s.log.Debug("fire publish failed; retrying", "key", p.key, "occurrence", p.occ, "err", cause)
	s.mu.Lock()
	defer s.mu.Unlock()
	en, ok := s.index.table(p.wait)[p.key]
	if !ok {
		return // cancelled or ended meanwhile
	}
	if p.wait {
		if en.fired != p.due || en.pos >= 0 {
			return // a newer record moved or re-armed it
		}
		en.fired = 0
	} else {
		if en.fired < p.occ {
			return
		}
		en.fired = p.occ - 1
		en.occ = p.occ
		en.awaiting = false
		en.retry = nil
		if p.timer.NextDue != nil && p.timer.Occurrence == p.occ {
			f := p.timer
			en.retry = &f
		}
	}
	en.due = p.due
	en.attempts++
	en.at = s.cfg.Now().Add(retries.Delay(en.attempts - 1)).UnixNano()
	s.index.arm(en)
	s.Wake()
}

func (s *Scheduler) queueRecord(f timers.TimerFired) {
	if s.cfg.Records == nil {
		return
	}
	s.records.push(f)
}

// recordLoop writes delivered occurrences into their timer records,
// retrying each until it sticks: the delivery is already stored, and a
// record left behind would only make the next owner publish it again (a
// duplicate the IDs absorb).
func (s *Scheduler) recordLoop(ctx context.Context) {
	for {
		f, ok := s.records.pop(ctx)
		if !ok || !s.yieldToFires(ctx) {
			return
		}
		s.record(ctx, &f)
	}
}

// burstYield bounds how long record updates stand back for one burst.
const burstYield = 200 * time.Millisecond

// yieldToFires holds record updates back while fires are in flight: each
// is two KV round trips that would compete with the publishes agents are
// waiting for. The bound is counted once per burst for all workers, not
// per update, so records fall behind a burst but never without end. It
// paces work against real CPU contention, so it reads the real clock.
func (s *Scheduler) yieldToFires(ctx context.Context) bool {
	for len(s.pending) > 0 {
		start := s.burstStart.Load()
		if start == 0 {
			s.burstStart.CompareAndSwap(0, time.Now().UnixNano())
			continue
		}
		if time.Since(time.Unix(0, start)) >= burstYield {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(2 * time.Millisecond):
		}
	}
	s.burstStart.Store(0)
	return true
}

// record writes one delivered occurrence into its record, retrying until
// it sticks. An occurrence that overtook an earlier one's update waits for
// it, but not forever: if the gap is not filled within outOfOrderLimit the
// earlier one was numbered by a replica that lost the shard, and the
// record has moved on without it.
func (s *Scheduler) record(ctx context.Context, f *timers.TimerFired) {
	start := s.cfg.Now()
	for attempt := 0; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		applied, err := s.cfg.Records.ApplyFire(rctx, f)
		cancel()
		if err == nil {
			if applied {
				s.m.applied.Inc()
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, timers.ErrOutOfOrder) && s.cfg.Now().Sub(start) > outOfOrderLimit {
			s.log.Warn("timer occurrence never became the next to record; dropped", "timer_id", f.TimerID, "occurrence", f.Occurrence)
			return
		}
		s.m.recordFailures.Inc()
		s.log.Debug("timer record update failed; retrying", "timer_id", f.TimerID, "occurrence", f.Occurrence, "err", err)
		if !retries.Sleep(ctx, attempt) {
			return
		}
	}
}

// outOfOrderLimit bounds how long an occurrence waits for an earlier one's
// record update.
const outOfOrderLimit = 30 * time.Second

// storedFire reads the timer_fired data stored at seq in the inbox.
func (s *Scheduler) storedFire(ctx context.Context, seq uint64) (*timers.TimerFiredData, error) {
	env, err := s.cfg.Inbox.StoredEnvelope(ctx, seq)
	if err != nil {
		return nil, err
	}
	var d timers.TimerFiredData
	if env.Kind != subjects.KindTimerFired {
		return nil, fmt.Errorf("inbox %d holds a %s", seq, env.Kind)
	}
	if err := json.Unmarshal(env.Data, &d); err != nil {
		return nil, fmt.Errorf("inbox %d: %w", seq, err)
	}
	return &d, nil
}
