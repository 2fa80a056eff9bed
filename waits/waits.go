// Package waits owns managed waits and interventions: wait records in the
// waits KV bucket and every change to them (create, complete, cancel,
// pause, resume) as a CAS, so a wait ends exactly once whoever races to end
// it; the consumers that complete a wait at its target and apply
// interventions in order; and each ended wait's one terminal delivery. The
// agent's pause state is kept through package agents; when a wait is due
// is the scheduler's business.
package waits

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/partitions"
	"github.com/chime-nats/chime/subjects"
)

// PauseThreshold is the shortest pause that moves duration waits, as in
// Agent Zero.
const PauseThreshold = 1500 * time.Millisecond

// Store reads and writes waits and agent state.
type Store struct {
	waits     *partitions.Set
	agents    *agents.Store
	now       func() time.Time
	retention kvrec.Retention
	// history and archiver: where ended waits go (see WithHistory).
	history  kvrec.History
	archiver *kvrec.Archiver
}

// NewStore returns a Store over the waits bucket; the agents' pause state
// is read and kept in agents. Ended waits are removed after retention.
func NewStore(waits *partitions.Set, agents *agents.Store, now func() time.Time, retention kvrec.Retention) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{waits: waits, agents: agents, now: now, retention: retention}
}

// WithHistory makes ended waits leave their bucket for h, moved there by a
// (see kvrec.Archiver), and reads them there: a get, a list, an end that
// finds the wait ended. A wait whose ID the caller chose (an id or a
// request_id) stays in its bucket for its retention, as before, so that
// the ID stays taken (wait_exists) or the request's retry finds it; so
// does a wait cancelled by an intervention (see archive).
func (s *Store) WithHistory(h kvrec.History, a *kvrec.Archiver) *Store {
	s.history, s.archiver = h, a
	return s
}

// archive hands a wait just written ended at rev to the archiver. Only an
// end that a retry finds again through Update goes: a completion (the
// fire's redelivery) and a cancel by request (the request's retry). A
// wait cancelled by an intervention stays in its bucket: the
// intervention's redelivery finds what it cancelled, to deliver its end
// again, by listing the bucket (see Consumer.apply), and the history is
// not listed for that.
func (s *Store) archive(kv jetstream.KeyValue, key string, rev uint64, w *Wait) {
	if !w.Ended() || !chimePicked(w) || !s.history.On() {
		return
	}
	if w.Status != WaitCompleted && w.CancelledBy != CancelByRequest {
		return
	}
	data, err := json.Marshal(w)
	if err != nil {
		return // it stays in its bucket
	}
	s.archiver.Archive(s.history, kv, key, rev, w.AgentID, w.ID, data)
}

// chimePicked reports whether w's ID is one chime picked (wait_ and a
// NUID) rather than the caller (an id, or one derived from a request_id).
// An id the caller chose in that very shape counts as chime's.
func chimePicked(w *Wait) bool {
	const prefix, nuidLen = "wait_", 22
	if w.RequestID != "" || len(w.ID) != len(prefix)+nuidLen || !strings.HasPrefix(w.ID, prefix) {
		return false
	}
	for _, c := range w.ID[len(prefix):] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

// ended reads a wait that has left its bucket from the history; the
// wait_not_found error when it is not there either.
func (s *Store) ended(ctx context.Context, agentID, waitID string) (*Wait, error) {
	w, err := kvrec.HistoryGet(ctx, s.history, agentID, waitID, func(w *Wait) string { return w.ID })
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, notFound(waitID)
	}
	if err != nil {
		return nil, fmt.Errorf("waits: get: %w", err)
	}
	return w, nil
}

// Create stores a new waiting wait. A duration wait created while its agent
// is paused starts paused: its clock runs from the resume. A request with
// a request_id makes the wait whose ID derives from it: a retry of that
// request, on any replica, finds and returns that wait as it is now, and
// the same request_id with another request is a conflict.
func (s *Store) Create(ctx context.Context, agentID string, spec *WaitSpec) (*Wait, error) {
	now := s.now().UTC()
	w := &Wait{
		ID: spec.ID, AgentID: agentID, Mode: spec.Mode, Status: WaitWaiting,
		CreatedAt: now, TargetTime: spec.Target.UTC(), TZ: spec.TZ, RequestKey: spec.Request,
	}
	switch {
	case spec.Request.RequestID != "":
		w.ID = subjects.WaitIDFor(agentID, spec.Request.RequestID)
	case w.ID == "":
		w.ID = "wait_" + nuid.Next()
	}
	if w.Mode == WaitDuration {
		st, err := s.Agent(ctx, agentID)
		if err != nil {
			return nil, err
		}
		if st.PausedAt != nil {
			w.PausedAt = &now
		}
	}
	// As for timers: a retry that finds this very wait, or the caller's
	// retry of the same request, succeeds with the stored wait.
	mine := func(stored *Wait) bool {
		return stored.ID == w.ID && (stored.CreatedAt.Equal(w.CreatedAt) || w.Replays(stored.RequestKey))
	}
	kv, key := s.waits.For(agentID, w.ID)
	stored, _, err := kvrec.Create(ctx, kv, key, w, mine)
	switch {
	case errors.Is(err, jetstream.ErrKeyExists) && w.RequestID != "":
		return nil, w.Conflict()
	case errors.Is(err, jetstream.ErrKeyExists):
		return nil, &subjects.Error{Code: CodeWaitExists, Message: fmt.Sprintf("wait %s already exists", w.ID)}
	case err != nil:
		return nil, fmt.Errorf("waits: create: %w", err)
	}
	return stored, nil
}

// Sweep gives the ended waits stored before records expired their TTL
// (see kvrec.Sweep) and returns how many.
func (s *Store) Sweep(ctx context.Context) (int, error) {
	total := 0
	for _, kv := range s.waits.KVs {
		n, err := kvrec.Sweep(ctx, s.retention, kv, (*Wait).Ended, s.now())
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// Get returns one of the agent's waits.
func (s *Store) Get(ctx context.Context, agentID, waitID string) (*Wait, error) {
	kv, key := s.waits.For(agentID, waitID)
	w, _, err := kvrec.Get[Wait](ctx, kv, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return s.ended(ctx, agentID, waitID)
	}
	if err != nil {
		return nil, fmt.Errorf("waits: get: %w", err)
	}
	return w, nil
}

func notFound(waitID string) error {
	return &subjects.Error{Code: CodeWaitNotFound, Message: fmt.Sprintf("wait %s not found", waitID)}
}

// Update changes one wait by CAS; see kvrec.Update.
func (s *Store) Update(ctx context.Context, agentID, waitID string, change func(*Wait) (bool, error)) (*Wait, bool, error) {
	return s.update(ctx, agentID, waitID, 0, change)
}

// update is Update of a wait known to have reached revision atLeast (0:
// not known).
func (s *Store) update(ctx context.Context, agentID, waitID string, atLeast uint64, change func(*Wait) (bool, error)) (*Wait, bool, error) {
	kv, key := s.waits.For(agentID, waitID)
	w, rev, changed, err := kvrec.UpdateRev(ctx, kv, key, false, change,
		kvrec.ExpireFinished(s.retention, (*Wait).Ended), kvrec.AtLeast[Wait](atLeast))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		// Ended and moved to the history, or never there. An ended wait
		// is never written again, so change only answers from it.
		w, err := s.ended(ctx, agentID, waitID)
		if err != nil {
			return nil, false, err
		}
		if _, err := change(w); err != nil {
			return nil, false, err
		}
		return w, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("waits: %w", err)
	}
	if changed {
		s.archive(kv, key, rev, w)
	}
	return w, changed, nil
}

// staleFor bounds how long after a fire an answer older than the fire's
// revision is taken for a stale one. A server back from a partition leads
// on its old store for a second or so, one on the minority side for at most
// 20 s (nats-server's lost-quorum check); a revision that still goes back
// after that belongs to a bucket made anew, and the fire finds what it
// holds.
const staleFor = time.Minute

// Complete ends a wait whose target fire is ev: only if it still waits,
// unpaused, for that very target. ended reports whether the wait is now
// completed (by this call or an earlier delivery of the same event). The
// record is read at or after the revision the fire was decided on: an
// older answer (a copy, or a leader back from a partition, that lacks it)
// is asked again rather than taken for a wait that is gone or moved.
func (s *Store) Complete(ctx context.Context, ev *WaitFired) (w *Wait, ended bool, err error) {
	atLeast := ev.Rev
	if s.now().Sub(ev.FiredAt) > staleFor {
		atLeast = 0 // no copy lags that long: a bucket made anew
	}
	w, _, err = s.update(ctx, ev.AgentID, ev.WaitID, atLeast, func(w *Wait) (bool, error) {
		if !w.Armed() || !w.TargetTime.Equal(ev.Target) {
			return false, nil
		}
		at := s.now().UTC()
		w.Status, w.EndedAt = WaitCompleted, &at
		return true, nil
	})
	if errors.Is(err, ErrWaitNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return w, w.Status == WaitCompleted && w.TargetTime.Equal(ev.Target), nil
}

// Cancel ends a waiting wait as cancelled by by (an intervention ID or
// subjects.CancelByRequest) with text. ended reports whether the wait is
// cancelled by by now, including by an earlier attempt.
func (s *Store) Cancel(ctx context.Context, agentID, waitID, by, text string) (w *Wait, ended bool, err error) {
	w, _, err = s.Update(ctx, agentID, waitID, func(w *Wait) (bool, error) {
		if w.Status != WaitWaiting {
			return false, nil
		}
		at := s.now().UTC()
		w.Status, w.EndedAt, w.CancelledBy, w.CancelText = WaitCancelled, &at, by, text
		return true, nil
	})
	if err != nil {
		return nil, false, err
	}
	return w, w.Status == WaitCancelled && w.CancelledBy == by, nil
}

// List returns the agent's waits.
func (s *Store) List(ctx context.Context, agentID string) ([]Wait, error) {
	var out []Wait
	for _, kv := range s.waits.KVs {
		part, err := kvrec.List[Wait](ctx, kv, s.waits.Layout.AgentKeys(agentID))
		if err != nil {
			return nil, fmt.Errorf("waits: list: %w", err)
		}
		out = append(out, part...)
	}
	return out, nil
}

// Page returns a page of the agent's waits, as timers.Store.List does
// for timers.
func (s *Store) Page(ctx context.Context, agentID string, limit int, from subjects.CursorPos) ([]Wait, subjects.CursorPos, error) {
	pg, err := kvrec.PageWithHistory(ctx, s.retention.JS, s.waits.Buckets(), s.waits.Layout.AgentKeys(agentID), s.history, agentID, kvrec.Pos(from), limit,
		func(w *Wait) (string, string) {
			kv, key := s.waits.For(agentID, w.ID)
			return kv.Bucket(), key
		})
	if errors.Is(err, kvrec.ErrPos) {
		return nil, subjects.CursorPos{}, subjects.ErrCursorStale()
	}
	if err != nil {
		return nil, subjects.CursorPos{}, fmt.Errorf("waits: list: %w", err)
	}
	return pg.Items, subjects.CursorPos(pg.Next), nil
}

// Agent returns the agent's state; an agent never seen has the zero state.
func (s *Store) Agent(ctx context.Context, agentID string) (*agents.AgentState, error) {
	st, _, err := s.agents.Get(ctx, agentID)
	return st, err
}

// Pause stops the agent's duration-wait clocks at at. Pausing a paused
// agent changes nothing.
func (s *Store) Pause(ctx context.Context, agentID string, at time.Time) error {
	at = at.UTC()
	if err := s.agents.Pause(ctx, agentID, at); err != nil {
		return fmt.Errorf("waits: pause: %w", err)
	}
	return s.eachWaiting(ctx, agentID, func(w *Wait) bool {
		if w.Mode != WaitDuration || w.PausedAt != nil {
			return false
		}
		w.PausedAt = &at
		return true
	})
}

// Resume restarts the clocks: a duration wait paused longer than
// PauseThreshold moves later by its paused time. The agent's
// record is cleared last, so a resume cut short is finished by its retry.
func (s *Store) Resume(ctx context.Context, agentID string, at time.Time) error {
	at = at.UTC()
	if err := s.eachWaiting(ctx, agentID, func(w *Wait) bool {
		if w.PausedAt == nil {
			return false
		}
		if paused := at.Sub(*w.PausedAt); paused > PauseThreshold {
			w.TargetTime = w.TargetTime.Add(paused)
			w.PausedMs += paused.Milliseconds()
		}
		w.PausedAt = nil
		return true
	}); err != nil {
		return err
	}
	if err := s.agents.Resume(ctx, agentID); err != nil {
		return fmt.Errorf("waits: resume: %w", err)
	}
	return nil
}

// eachWaiting applies change by CAS to each of the agent's waiting waits.
func (s *Store) eachWaiting(ctx context.Context, agentID string, change func(*Wait) bool) error {
	all, err := s.List(ctx, agentID)
	if err != nil {
		return err
	}
	for _, w := range all {
		if w.Status != WaitWaiting {
			continue
		}
		_, _, err := s.Update(ctx, agentID, w.ID, func(w *Wait) (bool, error) {
			return w.Status == WaitWaiting && change(w), nil
		})
		if err != nil && !errors.Is(err, ErrWaitNotFound) {
			return err
		}
	}
	return nil
}
