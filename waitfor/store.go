package waitfor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/subjects"
)

// Store keeps registrations and each agent's scope index.
type Store struct {
	kv        jetstream.KeyValue
	now       func() time.Time
	retention kvrec.Retention
}

// NewStore returns a Store over the chime_waitfor bucket; ended
// registrations are removed after retention.
func NewStore(kv jetstream.KeyValue, now func() time.Time, retention kvrec.Retention) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{kv: kv, now: now, retention: retention}
}

func recKey(agentID, waitID string) string { return "rec." + agentID + "." + waitID }
func idxKey(agentID string) string         { return "idx." + agentID }

// index names the live registration of each of an agent's scopes: "" is
// the agent scope, anything else a work item. Each entry says what it
// waits on, so that an envelope reads only the records it can concern.
type index struct {
	Scopes map[string]scope `json:"scopes"`
}

// scope is an index entry.
type scope struct {
	WaitID   string            `json:"wait_id"`
	Wake     subjects.WakeKind `json:"wake"`
	Resource string            `json:"resource,omitempty"`
	// Resources is the set of a wait.tasks.
	Resources []string `json:"resources,omitempty"`
}

func notFound(waitID string) error {
	return &subjects.Error{Code: subjects.CodeWaitForNotFound, Message: fmt.Sprintf("WaitFor %s not found", waitID)}
}

// create stores a new registration.
func (s *Store) create(ctx context.Context, w *subjects.WaitFor) error {
	mine := func(stored *subjects.WaitFor) bool { return stored.ID == w.ID && stored.CreatedAt.Equal(w.CreatedAt) }
	if _, _, err := kvrec.Create(ctx, s.kv, recKey(w.AgentID, w.ID), w, mine); err != nil {
		return fmt.Errorf("waitfor: create: %w", err)
	}
	return nil
}

// Get returns one of the agent's registrations.
func (s *Store) Get(ctx context.Context, agentID, waitID string) (*subjects.WaitFor, error) {
	w, _, err := kvrec.Get[subjects.WaitFor](ctx, s.kv, recKey(agentID, waitID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, notFound(waitID)
	}
	if err != nil {
		return nil, fmt.Errorf("waitfor: get: %w", err)
	}
	return w, nil
}

// update changes one registration by CAS; ended ones expire after retention.
func (s *Store) update(ctx context.Context, agentID, waitID string, change func(*subjects.WaitFor) (bool, error)) (*subjects.WaitFor, bool, error) {
	w, changed, err := kvrec.Update(ctx, s.kv, recKey(agentID, waitID), false, change,
		kvrec.ExpireFinished(s.retention, (*subjects.WaitFor).Ended))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, false, notFound(waitID)
	}
	if err != nil {
		return nil, false, fmt.Errorf("waitfor: %w", err)
	}
	return w, changed, nil
}

// swap makes w the live registration of its scope and returns the one it
// replaces ("" for none).
func (s *Store) swap(ctx context.Context, w *subjects.WaitFor) (string, error) {
	var old string
	_, _, err := kvrec.Update(ctx, s.kv, idxKey(w.AgentID), true, func(ix *index) (bool, error) {
		old = ix.Scopes[w.WorkItemID].WaitID
		if old == w.ID {
			old = "" // a retry that already swapped
			return false, nil
		}
		if ix.Scopes == nil {
			ix.Scopes = map[string]scope{}
		}
		ix.Scopes[w.WorkItemID] = scope{WaitID: w.ID, Wake: w.Wake, Resource: w.Resource, Resources: w.Resources}
		return true, nil
	})
	if err != nil {
		return "", fmt.Errorf("waitfor: index: %w", err)
	}
	return old, nil
}

// unindex drops an ended registration from its scope, if still there, so
// the index holds live scopes only.
func (s *Store) unindex(ctx context.Context, w *subjects.WaitFor) error {
	_, _, err := kvrec.Update(ctx, s.kv, idxKey(w.AgentID), false, func(ix *index) (bool, error) {
		if ix.Scopes[w.WorkItemID].WaitID != w.ID {
			return false, nil
		}
		delete(ix.Scopes, w.WorkItemID)
		return true, nil
	})
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("waitfor: unindex: %w", err)
	}
	return nil
}

// Live returns the registrations the agent's index names that env may
// concern (all, for a nil env): one per scope at most. The index, not a
// listing, decides which is current, so one whose replacement was cut
// short by a crash is never woken.
func (s *Store) Live(ctx context.Context, agentID string, env *subjects.Envelope) ([]*subjects.WaitFor, error) {
	ix, _, err := kvrec.Get[index](ctx, s.kv, idxKey(agentID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("waitfor: index: %w", err)
	}
	var out []*subjects.WaitFor
	for _, sc := range ix.Scopes {
		if env != nil && !concerns(sc.Wake, sc.Resource, sc.Resources, env) {
			continue
		}
		w, err := s.Get(ctx, agentID, sc.WaitID)
		if errors.Is(err, subjects.ErrWaitForNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, nil
}

// List returns the agent's registrations, live and ended (until their
// retention removes them), newest first, at most limit.
func (s *Store) List(ctx context.Context, agentID string, limit int) ([]subjects.WaitFor, error) {
	out, err := kvrec.List[subjects.WaitFor](ctx, s.kv, recKey(agentID, "*"))
	if err != nil {
		return nil, fmt.Errorf("waitfor: list: %w", err)
	}
	return kvrec.NewestFirst(out, func(w *subjects.WaitFor) time.Time { return w.CreatedAt }, limit), nil
}
