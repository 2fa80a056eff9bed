// Package timers owns timers: their records in the JetStream KV bucket
// (create, list, get, cancel, every read-modify-write a CAS on the entry's
// revision) and the consumer that applies each fired occurrence to its
// record. When a timer is due is the scheduler's business.
package timers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/partitions"
	"github.com/chime-nats/chime/subjects"
)

// Store reads and writes timer records.
type Store struct {
	set       *partitions.Set
	now       func() time.Time
	retention kvrec.Retention
	// history and archiver: where finished timers go (see WithHistory).
	history  kvrec.History
	archiver *kvrec.Archiver
}

// NewStore returns a Store over the timers buckets. now is the clock that
// stamps records; finished timers are removed after retention.
func NewStore(set *partitions.Set, now func() time.Time, retention kvrec.Retention) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{set: set, now: now, retention: retention}
}

// WithHistory makes finished timers leave their bucket for h, moved there
// by a (see kvrec.Archiver), and reads them there: a get, a list, a
// second cancel. A timer made with a request_id stays in its bucket for
// its retention, as before, so that a retry of that request finds it
// there (the key it would be made under is taken until then).
func (s *Store) WithHistory(h kvrec.History, a *kvrec.Archiver) *Store {
	s.history, s.archiver = h, a
	return s
}

// archive hands a timer just written finished at rev to the archiver.
func (s *Store) archive(kv jetstream.KeyValue, key string, rev uint64, t *Timer) {
	if !t.Finished() || t.RequestID != "" || !s.history.On() {
		return
	}
	data, err := json.Marshal(t)
	if err != nil {
		return // it stays in its bucket
	}
	s.archiver.Archive(s.history, kv, key, rev, t.AgentID, t.ID, data)
}

// finished reads a timer that has left its bucket from the history;
// ErrNotFound when it is not there either.
func (s *Store) finished(ctx context.Context, agentID, timerID string) (*Timer, error) {
	t, err := kvrec.HistoryGet(ctx, s.history, agentID, timerID, func(t *Timer) string { return t.ID })
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, ErrNotFound(timerID)
	}
	if err != nil {
		return nil, fmt.Errorf("timers: get %s: %w", timerID, err)
	}
	return t, nil
}

// Create stores a new active timer and returns its record. A create with
// a request_id makes the timer whose ID derives from it: a retry of that
// request, on any replica, finds and returns that timer as it is now, and
// the same request_id with another request is a conflict.
func (s *Store) Create(ctx context.Context, agentID string, spec TimerSpec) (*Timer, error) {
	now := s.now().UTC()
	next := now.Add(spec.Duration)
	t := &Timer{
		ID:             subjects.NewTimerID(),
		AgentID:        agentID,
		CreatedAt:      now,
		DurationMs:     spec.Duration.Milliseconds(),
		Status:         TimerActive,
		Summary:        spec.Summary,
		NextFireAt:     &next,
		AuthorityClass: spec.AuthorityClass,
		RequestKey:     spec.Request,
	}
	if spec.Request.RequestID != "" {
		t.ID = subjects.TimerIDFor(agentID, spec.Request.RequestID)
	}
	if spec.Interval > 0 {
		ms := spec.Interval.Milliseconds()
		t.IntervalMs = &ms
		t.Repeat = true
	}
	if spec.Calendar.IsCalendar() {
		if err := createCalendar(t, spec.Calendar, now); err != nil {
			return nil, err
		}
	}
	// The ID is fixed before the first attempt, so a retry (kvrec.Create
	// retries through leader elections) that finds this very timer stored
	// by an attempt whose answer was lost succeeds instead of storing a
	// second one; so does the caller's retry of the same request.
	mine := func(stored *Timer) bool {
		return stored.ID == t.ID && (stored.CreatedAt.Equal(t.CreatedAt) || t.Replays(stored.RequestKey))
	}
	kv, key := s.set.For(agentID, t.ID)
	stored, _, err := kvrec.Create(ctx, kv, key, t, mine)
	if errors.Is(err, jetstream.ErrKeyExists) && t.RequestID != "" {
		return nil, t.Conflict()
	}
	if err != nil {
		return nil, fmt.Errorf("timers: create %s: %w", t.ID, err)
	}
	return stored, nil
}

// Sweep gives the finished timers stored before records expired their TTL
// (see kvrec.Sweep) and returns how many.
func (s *Store) Sweep(ctx context.Context) (int, error) {
	total := 0
	for _, kv := range s.set.KVs {
		n, err := kvrec.Sweep(ctx, s.retention, kv, (*Timer).Finished, s.now())
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// Get returns one of the agent's timers.
func (s *Store) Get(ctx context.Context, agentID, timerID string) (*Timer, error) {
	kv, key := s.set.For(agentID, timerID)
	t, _, err := kvrec.Get[Timer](ctx, kv, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return s.finished(ctx, agentID, timerID)
	}
	if err != nil {
		return nil, fmt.Errorf("timers: get %s: %w", timerID, err)
	}
	return t, nil
}

// update changes one timer by CAS (see kvrec.Update), riding out leader
// elections within ctx.
func (s *Store) update(ctx context.Context, agentID, timerID string, change func(*Timer) (bool, error)) (*Timer, bool, error) {
	kv, key := s.set.For(agentID, timerID)
	t, rev, changed, err := kvrec.UpdateRev(ctx, kv, key, false, change,
		kvrec.ExpireFinished(s.retention, (*Timer).Finished))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		// Finished and moved to the history, or never there. A finished
		// timer is never written again, so change only answers from it
		// (a second cancel, a completed one's refusal).
		t, err := s.finished(ctx, agentID, timerID)
		if err != nil {
			return nil, false, err
		}
		if _, err := change(t); err != nil {
			return nil, false, err
		}
		return t, false, nil
	}
	if err == nil && changed {
		s.archive(kv, key, rev, t)
	}
	return t, changed, err
}

// List returns a page of the agent's timers: at most limit, from from (a
// cursor's place; the zero one is the start): those in their bucket in the
// order of each timer's last change (oldest first), then those in the
// history in the order they finished; and where the next page starts. It reads
// what it returns (see kvrec.ListPage), whatever else the agent keeps.
func (s *Store) List(ctx context.Context, agentID string, limit int, from subjects.CursorPos) ([]Timer, subjects.CursorPos, error) {
	pg, err := kvrec.PageWithHistory(ctx, s.retention.JS, s.set.Buckets(), s.set.Layout.AgentKeys(agentID), s.history, agentID, kvrec.Pos(from), limit,
		func(t *Timer) (string, string) {
			kv, key := s.set.For(agentID, t.ID)
			return kv.Bucket(), key
		})
	if errors.Is(err, kvrec.ErrPos) {
		return nil, subjects.CursorPos{}, subjects.ErrCursorStale()
	}
	if err != nil {
		return nil, subjects.CursorPos{}, fmt.Errorf("timers: list: %w", err)
	}
	return pg.Items, subjects.CursorPos(pg.Next), nil
}

// Someone reports whether a timer with this ID exists under any agent:
// a timer is keyed by its agent, so one agent asking for another's finds
// it only this way. It looks in the buckets only, not in the history: the
// history's subjects name the agent, so finding an ID there without it
// would read a sixteenth of every agent's finished timers, a cost any
// agent could ask for with an ID it made up.
func (s *Store) Someone(ctx context.Context, timerID string) (bool, error) {
	for _, kv := range s.set.KVs {
		found, err := kvrec.List[Timer](ctx, kv, s.set.Layout.IDKeys(timerID))
		if err != nil {
			return false, fmt.Errorf("timers: find %s: %w", timerID, err)
		}
		if len(found) > 0 {
			return true, nil
		}
	}
	return false, nil
}

// Cancel cancels an active timer. Cancelling a cancelled timer is a no-op
// that returns the record; a completed one-shot cannot be cancelled.
func (s *Store) Cancel(ctx context.Context, agentID, timerID string) (*Timer, error) {
	t, _, err := s.update(ctx, agentID, timerID, func(t *Timer) (bool, error) {
		switch t.Status {
		case TimerCancelled:
			return false, nil
		case TimerCompleted:
			return false, ErrCompleted(timerID)
		}
		t.Status, t.NextFireAt = TimerCancelled, nil
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("timers: cancel %s: %w", timerID, err)
	}
	return t, nil
}

// ApplyFire writes a delivered occurrence into its timer record by CAS. It
// returns false when there was nothing to write: the occurrence was
// applied before, superseded, the timer was cancelled first, or the
// record is gone; ErrOutOfOrder when an earlier occurrence is not written
// yet.
func (s *Store) ApplyFire(ctx context.Context, ev *TimerFired) (bool, error) {
	_, changed, err := s.update(ctx, ev.AgentID, ev.TimerID, func(t *Timer) (bool, error) {
		if t.IsCalendar() {
			return applyCalendarFire(t, ev)
		}
		return applyFire(t, ev.Occurrence, ev.DueAt, ev.FiredAt, ev.NextDue, s.now())
	})
	if errors.Is(err, subjects.ErrTimerNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("timers: apply fire %s: %w", ev.MsgID(), err)
	}
	return changed, nil
}
