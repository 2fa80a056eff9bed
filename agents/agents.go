// Package agents owns per-agent state: the one record each agent has in the
// chime_agents bucket (lifecycle status, pause, the wake hint awaiting the
// agent). Every feature that keeps something per agent reads and changes it
// here, each change a CAS on the record's revision, so two features never
// overwrite each other's fields.
package agents

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/kvrec"
)

// Store reads and writes agent records.
type Store struct {
	kv jetstream.KeyValue
}

// NewStore returns a Store over the agents bucket.
func NewStore(kv jetstream.KeyValue) *Store { return &Store{kv: kv} }

// Bucket is the name of the agents bucket, for watchers of its revisions.
func (s *Store) Bucket() string { return s.kv.Bucket() }

// Get returns the agent's record and its revision; an agent never seen has
// the zero state at revision 0.
func (s *Store) Get(ctx context.Context, agentID string) (*AgentState, uint64, error) {
	st, rev, err := kvrec.Get[AgentState](ctx, s.kv, agentID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return &AgentState{AgentID: agentID}, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("agents: %s: %w", agentID, err)
	}
	return st, rev, nil
}

// Update applies change to the agent's record by CAS (creating it when
// missing) and returns the record with the revision written, or read when
// change wrote nothing.
func (s *Store) Update(ctx context.Context, agentID string, change func(*AgentState) (bool, error)) (*AgentState, uint64, error) {
	st, rev, _, err := kvrec.UpdateRev(ctx, s.kv, agentID, true, func(st *AgentState) (bool, error) {
		st.AgentID = agentID
		return change(st)
	})
	if err != nil {
		return nil, 0, fmt.Errorf("agents: %s: %w", agentID, err)
	}
	return st, rev, nil
}

// Pause marks the agent paused at at; pausing a paused agent changes
// nothing.
func (s *Store) Pause(ctx context.Context, agentID string, at time.Time) error {
	_, _, err := s.Update(ctx, agentID, func(st *AgentState) (bool, error) {
		if st.PausedAt != nil {
			return false, nil
		}
		at := at.UTC()
		st.PausedAt = &at
		return true, nil
	})
	return err
}

// Resume clears the agent's pause.
func (s *Store) Resume(ctx context.Context, agentID string) error {
	_, _, err := s.Update(ctx, agentID, func(st *AgentState) (bool, error) {
		if st.PausedAt == nil {
			return false, nil
		}
		st.PausedAt = nil
		return true, nil
	})
	return err
}

// InterventionDone moves the agent's intervention cursor to seq of the
// events stream of epoch: the intervention stored there is applied or
// given up. Within one epoch the cursor only moves forward, so a late or
// repeated call changes nothing; a new epoch starts it over.
func (s *Store) InterventionDone(ctx context.Context, agentID string, seq uint64, epoch int64) error {
	_, _, err := s.Update(ctx, agentID, func(st *AgentState) (bool, error) {
		if InterventionCursor(st, epoch) >= seq {
			return false, nil
		}
		st.LastInterventionSeq, st.InterventionEpoch = seq, epoch
		return true, nil
	})
	return err
}

// InterventionCursor is the agent's intervention cursor in the events
// stream of epoch: zero when it was kept for another stream. A cursor
// without an epoch (written before epochs) is taken as this stream's.
func InterventionCursor(st *AgentState, epoch int64) uint64 {
	if st.InterventionEpoch != 0 && st.InterventionEpoch != epoch {
		return 0
	}
	return st.LastInterventionSeq
}

// List returns every agent record, in key order.
func (s *Store) List(ctx context.Context) ([]AgentState, error) {
	out, err := kvrec.List[AgentState](ctx, s.kv, ">")
	if err != nil {
		return nil, fmt.Errorf("agents: list: %w", err)
	}
	return out, nil
}

// InboxAck moves the agent's inbox cursor up to seq and returns it; a seq
// at or below the cursor changes nothing (acks may arrive out of order).
func (s *Store) InboxAck(ctx context.Context, agentID string, seq uint64) (uint64, error) {
	st, _, err := s.Update(ctx, agentID, func(st *AgentState) (bool, error) {
		if seq <= st.InboxAcked {
			return false, nil
		}
		st.InboxAcked = seq
		return true, nil
	})
	if err != nil {
		return 0, err
	}
	return st.InboxAcked, nil
}
