package callbacks

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/subjects"
)

// Keys in the triggers bucket:
//
//	rec.<agent>.<trigger>  the Trigger record
//	tok.<sha256 of token>  the tokenRef that finds it
//
// The record is written first, so a token never resolves to nothing; a
// crash before the second write leaves a trigger no token reaches, which
// listing shows and revoking cleans.
func recKey(agentID, triggerID string) string { return "rec." + agentID + "." + triggerID }
func tokKey(hash string) string               { return "tok." + hash }

type tokenRef struct {
	AgentID   string `json:"agent_id"`
	TriggerID string `json:"external_trigger_id"`
}

// Store reads and writes triggers and agent lifecycle.
type Store struct {
	triggers    jetstream.KeyValue
	agents      *agents.Store
	idempotency jetstream.KeyValue
	leases      jetstream.KeyValue // TTL bucket for the per-agent lifecycle guard
	leaseTTL    atomic.Int64       // the leases bucket's TTL, read at the first guard
	publicURL   string
	now         func() time.Time
	index       *Index
	retention   kvrec.Retention
	// onRevoke runs after a trigger is revoked: the callback sender's
	// open connections are ended there (package access).
	onRevoke func(ctx context.Context, t *Trigger)
}

// OnRevoke sets what runs after each trigger revocation.
func (s *Store) OnRevoke(fn func(ctx context.Context, t *Trigger)) { s.onRevoke = fn }

// NewStore returns a Store. Callbacks are resolved in index, and writes
// wait until index has them; idempotency (a TTL bucket) remembers stored
// callbacks' Idempotency-Keys; leases (chime_leases, whose keys expire)
// holds the guard that runs one lifecycle change of an agent at a time;
// publicURL is the base of trigger URLs (CHIME_PUBLIC_URL); revoked
// triggers are removed after retention.
func NewStore(triggers jetstream.KeyValue, agents *agents.Store, idempotency, leases jetstream.KeyValue, publicURL string, now func() time.Time, index *Index, retention kvrec.Retention) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{
		triggers: triggers, agents: agents, idempotency: idempotency, leases: leases, publicURL: publicURL, now: now, index: index,
		retention: retention,
	}
}

// idemKey turns a callback's dedup ID (subjects.CallbackMsgID) into a key.
func idemKey(id string) string { return strings.ReplaceAll(id, ":", ".") }

// Seen reports whether a callback with this dedup ID was stored within the
// idempotency TTL.
func (s *Store) Seen(ctx context.Context, id string) (bool, error) {
	_, err := s.idempotency.Get(ctx, idemKey(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("triggers: idempotency: %w", err)
	}
	return true, nil
}

// Remember records that the callback with this dedup ID is stored.
func (s *Store) Remember(ctx context.Context, id string) error {
	if _, err := s.idempotency.Put(ctx, idemKey(id), []byte("1")); err != nil {
		return fmt.Errorf("triggers: idempotency: %w", err)
	}
	return nil
}

// seen waits until the index reflects revision rev of kv's bucket.
func (s *Store) seen(ctx context.Context, kv jetstream.KeyValue, rev uint64) error {
	return s.index.waitSeen(ctx, kv.Bucket(), rev)
}

// usable reports whether t takes callbacks of mode for the token of hash.
func usable(t *Trigger, hash string, mode DeliveryMode) bool {
	return subtle.ConstantTimeCompare([]byte(t.TokenHash), []byte(hash)) == 1 && t.Status == TriggerActive && t.Mode == mode
}

// Issued is a trigger with its token, as handed out once.
type Issued struct {
	Trigger Trigger
	Token   string
}

// View is the issued trigger with its URL.
func (i *Issued) View(publicURL string) TriggerView {
	v := i.Trigger.View()
	v.TriggerURL = TriggerURL(publicURL, i.Trigger.Mode, i.Token)
	return v
}

// PublicURL is the base of trigger URLs.
func (s *Store) PublicURL() string { return s.publicURL }

// Agent returns the agent's state; an agent never seen has the zero state.
func (s *Store) Agent(ctx context.Context, agentID string) (*agents.AgentState, uint64, error) {
	return s.agents.Get(ctx, agentID)
}

// UpdateAgent applies change to the agent's state by CAS and returns once
// the index has seen the change.
func (s *Store) UpdateAgent(ctx context.Context, agentID string, change func(*agents.AgentState) (bool, error)) (*agents.AgentState, error) {
	st, rev, err := s.agents.Update(ctx, agentID, change)
	if err != nil {
		return nil, fmt.Errorf("triggers: %w", err)
	}
	return st, s.index.waitSeen(ctx, s.agents.Bucket(), rev)
}

// start marks the agent active and issues its default triggers, one per
// mode, after revoking every trigger it still has: a restarted agent's old
// URLs stay dead, even if the stop before crashed halfway. Tokens are not
// kept, so a start always hands out new ones.
func (s *Store) start(ctx context.Context, agentID string) ([]Issued, error) {
	if err := s.revokeAll(ctx, agentID); err != nil {
		return nil, err
	}
	now := s.now().UTC()
	if _, err := s.UpdateAgent(ctx, agentID, func(st *agents.AgentState) (bool, error) {
		st.Status, st.StartedAt, st.StoppedAt, st.PendingWake = agents.AgentActive, &now, nil, nil
		return true, nil
	}); err != nil {
		return nil, err
	}
	var out []Issued
	for _, mode := range DeliveryModes() {
		iss, err := s.issue(ctx, agentID, mode, "", true)
		if err != nil {
			return nil, err
		}
		out = append(out, *iss)
	}
	return out, nil
}

// Start starts the agent and issues its default triggers (see start),
// under the agent's lifecycle guard.
func (s *Store) Start(ctx context.Context, agentID string) (out []Issued, err error) {
	return out, s.guarded(ctx, agentID, func(ctx context.Context) error { out, err = s.start(ctx, agentID); return err })
}

// Stop stops the agent and revokes its triggers (see stop), under the
// agent's lifecycle guard.
func (s *Store) Stop(ctx context.Context, agentID string) (out []Trigger, err error) {
	return out, s.guarded(ctx, agentID, func(ctx context.Context) error { out, err = s.stop(ctx, agentID); return err })
}

// Reset replaces the agent's default trigger of mode (see reset), under
// the agent's lifecycle guard.
func (s *Store) Reset(ctx context.Context, agentID string, mode DeliveryMode) (out *Issued, err error) {
	return out, s.guarded(ctx, agentID, func(ctx context.Context) error { out, err = s.reset(ctx, agentID, mode); return err })
}

// Create issues an extra trigger for an active agent, under the agent's
// lifecycle guard, so none is issued to an agent being stopped.
func (s *Store) Create(ctx context.Context, agentID string, mode DeliveryMode, label string) (out *Issued, err error) {
	return out, s.guarded(ctx, agentID, func(ctx context.Context) error { out, err = s.create(ctx, agentID, mode, label); return err })
}

// revokeAll revokes every active trigger of the agent, found in the index
// (revoked records stay in the bucket for listing, for the record
// retention; they are not re-read).
func (s *Store) revokeAll(ctx context.Context, agentID string) error {
	for _, t := range s.index.active(agentID) {
		if _, err := s.Revoke(ctx, agentID, t.ID); err != nil {
			return err
		}
	}
	return nil
}

// stop marks the agent stopped, which already refuses its callbacks, then
// revokes every trigger it has.
func (s *Store) stop(ctx context.Context, agentID string) ([]Trigger, error) {
	now := s.now().UTC()
	if _, err := s.UpdateAgent(ctx, agentID, func(st *agents.AgentState) (bool, error) {
		st.Status, st.StoppedAt, st.PendingWake = agents.AgentStopped, &now, nil
		return true, nil
	}); err != nil {
		return nil, err
	}
	if err := s.revokeAll(ctx, agentID); err != nil {
		return nil, err
	}
	return s.List(ctx, agentID)
}

// reset revokes the agent's default trigger of mode and issues a new one.
// The agent must be active.
func (s *Store) reset(ctx context.Context, agentID string, mode DeliveryMode) (*Issued, error) {
	if err := s.requireActive(ctx, agentID); err != nil {
		return nil, err
	}
	return s.replaceDefault(ctx, agentID, mode)
}

// create issues an extra trigger for an active agent.
func (s *Store) create(ctx context.Context, agentID string, mode DeliveryMode, label string) (*Issued, error) {
	if err := s.requireActive(ctx, agentID); err != nil {
		return nil, err
	}
	return s.issue(ctx, agentID, mode, label, false)
}

func (s *Store) requireActive(ctx context.Context, agentID string) error {
	st, _, err := s.Agent(ctx, agentID)
	if err != nil {
		return err
	}
	if st.Status != agents.AgentActive {
		return &subjects.Error{Code: CodeAgentNotActive, Message: "agent " + agentID + " is not started"}
	}
	return nil
}

func (s *Store) replaceDefault(ctx context.Context, agentID string, mode DeliveryMode) (*Issued, error) {
	for _, t := range s.index.active(agentID) {
		if t.Default && t.Mode == mode {
			if _, err := s.Revoke(ctx, agentID, t.ID); err != nil {
				return nil, err
			}
		}
	}
	return s.issue(ctx, agentID, mode, "", true)
}

func (s *Store) issue(ctx context.Context, agentID string, mode DeliveryMode, label string, def bool) (*Issued, error) {
	token := NewToken()
	t := Trigger{
		ID: "trg_" + nuid.Next(), AgentID: agentID, Mode: mode, Label: label, Default: def,
		Status: TriggerActive, TokenHash: HashToken(token), CreatedAt: s.now().UTC(),
	}
	if _, _, err := kvrec.Update(ctx, s.triggers, recKey(agentID, t.ID), true, func(r *Trigger) (bool, error) {
		*r = t
		return true, nil
	}); err != nil {
		return nil, fmt.Errorf("triggers: store trigger: %w", err)
	}
	_, rev, _, err := kvrec.UpdateRev(ctx, s.triggers, tokKey(t.TokenHash), true, func(r *tokenRef) (bool, error) {
		*r = tokenRef{AgentID: agentID, TriggerID: t.ID}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("triggers: store token: %w", err)
	}
	return &Issued{Trigger: t, Token: token}, s.seen(ctx, s.triggers, rev)
}

// Revoke ends a trigger; revoking a revoked one changes nothing.
func (s *Store) Revoke(ctx context.Context, agentID, triggerID string) (*Trigger, error) {
	now := s.now().UTC()
	t, rev, _, err := kvrec.UpdateRev(ctx, s.triggers, recKey(agentID, triggerID), false, func(t *Trigger) (bool, error) {
		if t.Status == TriggerRevoked {
			return false, nil
		}
		t.Status, t.RevokedAt = TriggerRevoked, &now
		return true, nil
	}, kvrec.ExpireFinished(s.retention, (*Trigger).Revoked))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, TriggerNotFound(triggerID)
	}
	if err != nil {
		return nil, fmt.Errorf("triggers: revoke: %w", err)
	}
	// The record already refuses the token; dropping the reference (and,
	// after a while, its marker) keeps the bucket from growing with dead
	// tokens.
	if err := s.retention.Purge(ctx, s.triggers, tokKey(t.TokenHash)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("triggers: drop token: %w", err)
	}
	if err := s.seen(ctx, s.triggers, rev); err != nil {
		return nil, err
	}
	if s.onRevoke != nil {
		s.onRevoke(ctx, t)
	}
	return t, nil
}

// Sweep gives the revoked triggers, and the markers of dropped tokens,
// stored before records expired their TTL (see kvrec.Sweep) and returns
// how many.
func (s *Store) Sweep(ctx context.Context) (int, error) {
	return kvrec.Sweep(ctx, s.retention, s.triggers, (*Trigger).Revoked, s.now())
}

// List returns the agent's triggers, active and revoked (for the record
// retention).
func (s *Store) List(ctx context.Context, agentID string) ([]Trigger, error) {
	out, err := kvrec.List[Trigger](ctx, s.triggers, recKey(agentID, "*"))
	if err != nil {
		return nil, fmt.Errorf("triggers: list: %w", err)
	}
	return out, nil
}

// Resolve finds the active trigger of token for a callback of mode, with
// its agent active, in the index: no storage round trip. Every failure is
// the same ErrCallbackRejected.
func (s *Store) Resolve(token string, mode DeliveryMode) (*Trigger, error) {
	if token == "" || len(token) > 256 {
		return nil, ErrCallbackRejected
	}
	if t, ok := s.index.resolve(HashToken(token), mode); ok {
		return t, nil
	}
	return nil, ErrCallbackRejected
}
