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

// idxKey is the index entry of one of an agent's scopes: the agent scope,
// or a work item (a token of its own, so no work item ID can be taken for
// the agent scope's key).
func idxKey(agentID, workItemID string) string {
	if workItemID == "" {
		return "idx." + agentID + ".agent"
	}
	return "idx." + agentID + ".item." + workItemID
}

// idxKeys matches every index entry.
const idxKeys = "idx.>"

// scope is an index entry: the live registration of one of an agent's
// scopes and what it waits on, so that an envelope reads only the records
// it can concern. One key a scope keeps each write and read the size of
// one entry, however many scopes the agent has.
type scope struct {
	WaitID     string   `json:"wait_id"`
	WorkItemID string   `json:"work_item_id,omitempty"`
	Wake       WakeKind `json:"wake"`
	Resource   string   `json:"resource,omitempty"`
	// Resources is the set of a wait.tasks.
	Resources []string `json:"resources,omitempty"`

	rev uint64 // the entry's revision, in the view
}

func notFound(waitID string) error {
	return &subjects.Error{Code: CodeWaitForNotFound, Message: fmt.Sprintf("WaitFor %s not found", waitID)}
}

// create stores a new registration.
func (s *Store) create(ctx context.Context, w *WaitFor) error {
	mine := func(stored *WaitFor) bool { return stored.ID == w.ID && stored.CreatedAt.Equal(w.CreatedAt) }
	if _, _, err := kvrec.Create(ctx, s.kv, recKey(w.AgentID, w.ID), w, mine); err != nil {
		return fmt.Errorf("waitfor: create: %w", err)
	}
	return nil
}

// Get returns one of the agent's registrations.
func (s *Store) Get(ctx context.Context, agentID, waitID string) (*WaitFor, error) {
	w, _, err := kvrec.Get[WaitFor](ctx, s.kv, recKey(agentID, waitID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, notFound(waitID)
	}
	if err != nil {
		return nil, fmt.Errorf("waitfor: get: %w", err)
	}
	return w, nil
}

// update changes one registration by CAS; ended ones expire after retention.
func (s *Store) update(ctx context.Context, agentID, waitID string, change func(*WaitFor) (bool, error)) (*WaitFor, bool, error) {
	return s.write(ctx, agentID, waitID, change)
}

// updateFrom is update deciding first from cur, as the caller read it:
// no read when cur is current (see kvrec.Current).
func (s *Store) updateFrom(ctx context.Context, cur Versioned, change func(*WaitFor) (bool, error)) (*WaitFor, bool, error) {
	cp := *cur.WaitFor // change works on its own copy
	return s.write(ctx, cur.AgentID, cur.ID, change, kvrec.Current(&cp, cur.Rev))
}

func (s *Store) write(ctx context.Context, agentID, waitID string, change func(*WaitFor) (bool, error), opts ...kvrec.Option[WaitFor]) (*WaitFor, bool, error) {
	opts = append(opts, kvrec.ExpireFinished(s.retention, (*WaitFor).Ended))
	w, changed, err := kvrec.Update(ctx, s.kv, recKey(agentID, waitID), false, change, opts...)
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
func (s *Store) swap(ctx context.Context, w *WaitFor) (string, error) {
	var old string
	_, _, err := kvrec.Update(ctx, s.kv, idxKey(w.AgentID, w.WorkItemID), true, func(sc *scope) (bool, error) {
		old = sc.WaitID
		if old == w.ID {
			old = "" // a retry that already swapped
			return false, nil
		}
		*sc = scope{WaitID: w.ID, WorkItemID: w.WorkItemID, Wake: w.Wake, Resource: w.Resource, Resources: w.Resources}
		return true, nil
	})
	if err != nil {
		return "", fmt.Errorf("waitfor: index: %w", err)
	}
	return old, nil
}

// unindex drops an ended registration from its scope, if still there, so
// the index holds live scopes only. The entry is purged by CAS: a newer
// registration swapped in meanwhile stays. rev, when known, is the
// revision at which the entry named w: the first purge needs no read.
func (s *Store) unindex(ctx context.Context, w *WaitFor, rev uint64) error {
	key := idxKey(w.AgentID, w.WorkItemID)
	for range unindexAttempts {
		if rev == 0 {
			sc, cur, err := kvrec.Get[scope](ctx, s.kv, key)
			if errors.Is(err, jetstream.ErrKeyNotFound) || (err == nil && sc.WaitID != w.ID) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("waitfor: unindex: %w", err)
			}
			rev = cur
		}
		err := s.retention.PurgeRev(ctx, s.kv, key, rev)
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			if err != nil {
				return fmt.Errorf("waitfor: unindex: %w", err)
			}
			return nil
		}
		rev = 0
	}
	return fmt.Errorf("waitfor: unindex %s: %w", key, kvrec.ErrContended)
}

// unindexAttempts bounds the purges of an entry that keeps changing.
const unindexAttempts = 8

// live reads the registrations that entries (an agent's index, from the
// view) name and env may concern: one per scope at most. The index, not a
// listing, decides which is current, so one whose replacement was cut
// short by a crash is never woken.
func (s *Store) live(ctx context.Context, env *subjects.Envelope, entries []scope) ([]Versioned, error) {
	var out []Versioned
	for _, sc := range entries {
		if !concerns(sc.Wake, sc.Resource, sc.Resources, env) {
			continue
		}
		w, rev, err := kvrec.Get[WaitFor](ctx, s.kv, recKey(env.AgentID, sc.WaitID))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("waitfor: get: %w", err)
		}
		out = append(out, Versioned{WaitFor: w, Rev: rev, indexRev: sc.rev})
	}
	return out, nil
}

// List returns a page of the agent's registrations, live and ended
// (until their retention removes them), as timers.Store.List does for
// timers.
func (s *Store) List(ctx context.Context, agentID string, limit int, from subjects.CursorPos) ([]WaitFor, subjects.CursorPos, error) {
	pg, err := kvrec.ListPage[WaitFor](ctx, s.retention.JS, []string{s.kv.Bucket()}, recKey(agentID, "*"), kvrec.Pos(from), limit, nil)
	if errors.Is(err, kvrec.ErrPos) {
		return nil, subjects.CursorPos{}, subjects.ErrCursorStale()
	}
	if err != nil {
		return nil, subjects.CursorPos{}, fmt.Errorf("waitfor: list: %w", err)
	}
	return pg.Items, subjects.CursorPos(pg.Next), nil
}

// Versioned is a registration as read at revision Rev.
type Versioned struct {
	*WaitFor
	Rev uint64
	// indexRev is the revision of its index entry as the view holds it.
	indexRev uint64
}
