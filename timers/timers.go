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
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/subjects"
)

// casAttempts bounds retries of a read-modify-write that keeps losing the
// race to concurrent writers (fires updating the same record).
const casAttempts = 16

// Store reads and writes timer records.
type Store struct {
	kv  jetstream.KeyValue
	now func() time.Time
}

// NewStore returns a Store over the timers bucket. now is the clock that
// stamps records.
func NewStore(kv jetstream.KeyValue, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{kv: kv, now: now}
}

// Create stores a new active timer and returns its record.
func (s *Store) Create(ctx context.Context, agentID string, spec subjects.TimerSpec) (*subjects.Timer, error) {
	now := s.now().UTC()
	next := now.Add(spec.Duration)
	t := &subjects.Timer{
		ID:             subjects.NewTimerID(),
		AgentID:        agentID,
		CreatedAt:      now,
		DurationMs:     spec.Duration.Milliseconds(),
		Status:         subjects.TimerActive,
		Summary:        spec.Summary,
		NextFireAt:     &next,
		AuthorityClass: spec.AuthorityClass,
	}
	if spec.Interval > 0 {
		ms := spec.Interval.Milliseconds()
		t.IntervalMs = &ms
		t.Repeat = true
	}
	data, err := json.Marshal(t)
	if err != nil {
		return nil, fmt.Errorf("timers: encode: %w", err)
	}
	if _, err := s.kv.Create(ctx, subjects.TimerKey(agentID, t.ID), data); err != nil {
		return nil, fmt.Errorf("timers: create %s: %w", t.ID, err)
	}
	return t, nil
}

// Get returns one of the agent's timers.
func (s *Store) Get(ctx context.Context, agentID, timerID string) (*subjects.Timer, error) {
	t, _, err := s.get(ctx, agentID, timerID)
	return t, err
}

func (s *Store) get(ctx context.Context, agentID, timerID string) (*subjects.Timer, uint64, error) {
	e, err := s.kv.Get(ctx, subjects.TimerKey(agentID, timerID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, subjects.ErrNotFound(timerID)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("timers: get %s: %w", timerID, err)
	}
	t, err := Decode(e.Value())
	if err != nil {
		return nil, 0, err
	}
	return t, e.Revision(), nil
}

// Decode reads a stored record.
func Decode(data []byte) (*subjects.Timer, error) {
	var t subjects.Timer
	if err := json.Unmarshal(data, &t); err != nil {
		return nil, fmt.Errorf("timers: decode record: %w", err)
	}
	return &t, nil
}

// List returns up to limit of the agent's timers, newest first.
func (s *Store) List(ctx context.Context, agentID string, limit int) ([]subjects.Timer, error) {
	out, err := kvrec.List[subjects.Timer](ctx, s.kv, agentID+".*")
	if err != nil {
		return nil, fmt.Errorf("timers: list: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Cancel cancels an active timer. Cancelling a cancelled timer is a no-op
// that returns the record; a completed one-shot cannot be cancelled.
func (s *Store) Cancel(ctx context.Context, agentID, timerID string) (*subjects.Timer, error) {
	for range casAttempts {
		t, rev, err := s.get(ctx, agentID, timerID)
		if err != nil {
			return nil, err
		}
		switch t.Status {
		case subjects.TimerCancelled:
			return t, nil
		case subjects.TimerCompleted:
			return nil, subjects.ErrCompleted(timerID)
		}
		t.Status = subjects.TimerCancelled
		t.NextFireAt = nil
		data, err := json.Marshal(t)
		if err != nil {
			return nil, fmt.Errorf("timers: encode: %w", err)
		}
		_, err = s.kv.Update(ctx, subjects.TimerKey(agentID, timerID), data, rev)
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
			continue // a fire updated the record meanwhile: decide again
		}
		if err != nil {
			return nil, fmt.Errorf("timers: cancel %s: %w", timerID, err)
		}
		return t, nil
	}
	return nil, fmt.Errorf("timers: cancel %s: %w", timerID, ErrContended)
}

// ErrContended means a CAS kept losing to concurrent writers.
var ErrContended = errors.New("record changed concurrently too often")

// ApplyFire records a fire event on its timer by CAS. It returns false when
// there was nothing to apply: the occurrence was applied before, the timer was
// cancelled first, or the record is gone.
func (s *Store) ApplyFire(ctx context.Context, ev *subjects.TimerFired) (bool, error) {
	for range casAttempts {
		t, rev, err := s.get(ctx, ev.AgentID, ev.TimerID)
		if errors.Is(err, subjects.ErrTimerNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if !applyFire(t, ev.Occurrence, ev.DueAt, ev.FiredAt, s.now()) {
			return false, nil
		}
		data, err := json.Marshal(t)
		if err != nil {
			return false, fmt.Errorf("timers: encode: %w", err)
		}
		_, err = s.kv.Update(ctx, subjects.TimerKey(ev.AgentID, ev.TimerID), data, rev)
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("timers: apply fire %s: %w", ev.MsgID(), err)
		}
		return true, nil
	}
	return false, fmt.Errorf("timers: apply fire %s: %w", ev.MsgID(), ErrContended)
}
