package callbacks

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/backoff"
	"github.com/chime-nats/chime/internal/kvrec"
)

// ErrGuardLost is the cause of a guarded work's context ending because
// the lifecycle guard could not be renewed: another holder may have it,
// so the work must stop rather than interleave with theirs.
var ErrGuardLost = errors.New("triggers: lifecycle guard lost")

// guarded runs fn while holding the agent's lifecycle guard, a key
// created in the TTL bucket: two resets, or a start and a stop, of one
// agent never interleave (that could leave two defaults, or an active
// agent without triggers). A holder that dies frees it with the TTL. The
// key is renewed by CAS every quarter TTL, so work that outlasts the TTL
// keeps it; fn runs under a context that ends with ErrGuardLost once the
// key is no longer this holder's, or cannot be confirmed in time.
func (s *Store) guarded(ctx context.Context, agentID string, fn func(ctx context.Context) error) error {
	key := "lifecycle." + agentID
	ttl, err := s.guardTTL(ctx)
	if err != nil {
		return err
	}
	rev, err := s.takeGuard(ctx, agentID, key)
	if err != nil {
		return err
	}
	gctx, lose := context.WithCancelCause(ctx)
	renewed := make(chan uint64, 1)
	go func() { renewed <- s.renewGuard(gctx, key, rev, ttl, lose) }()
	err = fn(gctx)
	lose(nil) // stops the renewal; a cause already set stays
	last := <-renewed
	if cause := context.Cause(gctx); errors.Is(cause, ErrGuardLost) {
		if err != nil {
			return fmt.Errorf("triggers: lifecycle of %s: %w (%w)", agentID, cause, err)
		}
		return nil // the work was done before the loss was seen
	}
	// Only a key still at our last revision is ours to delete.
	_ = s.leases.Delete(context.WithoutCancel(ctx), key, jetstream.LastRevision(last))
	return err
}

// takeGuard creates the guard key, waiting while another holds it.
func (s *Store) takeGuard(ctx context.Context, agentID, key string) (uint64, error) {
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		rev, err := s.leases.Create(ctx, key, []byte("held"))
		if err == nil {
			return rev, nil
		}
		// A key its last holder deleted is created again by a write on
		// the deletion marker's revision; another taker first makes that
		// write a revision mismatch, which is the key held as well.
		if err = kvrec.RevisionMismatch(err); !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return 0, fmt.Errorf("triggers: lifecycle guard: %w", err)
		}
		if !backoff.Sleep(ctx, wait) {
			return 0, fmt.Errorf("triggers: lifecycle guard of %s: %w", agentID, ctx.Err())
		}
	}
}

// renewGuard updates the key by CAS every ttl/4 until ctx ends, and
// returns its last revision. A CAS refused means another holder has the
// key: lost at once. Other failures are retried at the next tick, but the
// guard counts as lost once it has gone unconfirmed for half the TTL, well
// before the key could expire and be taken.
func (s *Store) renewGuard(ctx context.Context, key string, rev uint64, ttl time.Duration, lose context.CancelCauseFunc) uint64 {
	every := ttl / 4
	t := time.NewTicker(every)
	defer t.Stop()
	confirmed := time.Now()
	for {
		select {
		case <-ctx.Done():
			return rev
		case <-t.C:
		}
		uctx, cancel := context.WithTimeout(ctx, every)
		next, err := s.leases.Update(uctx, key, []byte("held"), rev)
		cancel()
		switch {
		case err == nil:
			rev, confirmed = next, time.Now()
		case ctx.Err() != nil:
			return rev
		case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyNotFound),
			errors.Is(err, jetstream.ErrKeyRevisionMismatch), time.Since(confirmed) >= ttl/2:
			lose(fmt.Errorf("%w: %s: %w", ErrGuardLost, key, err))
			return rev
		}
		// Any other failure is tried again at the next tick.
	}
}

// guardTTL is the leases bucket's TTL, read once: the guard key's life.
func (s *Store) guardTTL(ctx context.Context) (time.Duration, error) {
	if ttl := time.Duration(s.leaseTTL.Load()); ttl > 0 {
		return ttl, nil
	}
	st, err := s.leases.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("triggers: lifecycle guard: leases bucket: %w", err)
	}
	ttl := st.TTL()
	if ttl <= 0 {
		// An unexpiring bucket never frees a dead holder's key anyway;
		// renewing keeps the same rhythm as chime's default lease TTL.
		ttl = 10 * time.Second
	}
	s.leaseTTL.Store(int64(ttl))
	return ttl, nil
}
