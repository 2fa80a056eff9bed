package scheduler

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// A held shard whose earliest attempt is stallAfter overdue is stalled:
// this replica keeps its lease, so no other replica fires it, and nothing
// else would say so. The scheduler looks every stallLook, logs the
// stalled shards with why each is not firing (at most every
// stallLogEvery, and once when they fire again), and exposes their count
// as chime_shards_stalled.
const (
	stallAfter    = 10 * time.Second
	stallLook     = 2 * time.Second
	stallLogEvery = 10 * time.Second
)

// stall is one stalled shard.
type stall struct {
	shard   int
	overdue time.Duration
	why     string
}

func (st stall) String() string {
	return fmt.Sprintf("%d (%s overdue: %s)", st.shard, st.overdue.Round(time.Second), st.why)
}

// stalls are the held shards stalled at now, and why each does not fire:
// the fire loop's own conditions (fireLoop), in its order.
func (s *Scheduler) stalls(now time.Time) []stall {
	owned := make([]bool, s.cfg.Shards)
	s.cfg.Leases.Owned(now, owned)
	live := make([]bool, s.cfg.Shards)
	for sh := range live {
		live[sh] = true
	}
	s.liveOnly(live)
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []stall
	for sh := range s.shardStates {
		st := &s.shardStates[sh]
		bits := st.bits.Load()
		h := s.index.shards[sh]
		if bits&shardHeld == 0 || len(h) == 0 {
			continue
		}
		overdue := now.Sub(time.Unix(0, h[0].at))
		if overdue < stallAfter {
			continue
		}
		var why string
		switch {
		case !owned[sh]:
			why = "its lease is not confirmed"
		case bits&shardLoading != 0:
			why = fmt.Sprintf("loading for %s", now.Sub(st.gainedAt).Round(time.Second))
		case !live[sh]:
			why = "a watch of its records is not live"
		default:
			why = "fireable, but the fire loop has not reached it"
		}
		out = append(out, stall{shard: sh, overdue: overdue, why: why})
	}
	return out
}

// stallLoop looks for stalled shards until ctx ends.
func (s *Scheduler) stallLoop(ctx context.Context) {
	t := time.NewTicker(stallLook)
	defer t.Stop()
	var logged time.Time // when stalls were last logged; zero: none since they cleared
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := s.cfg.Now()
		found := s.stalls(now)
		s.stalled.Store(int64(len(found)))
		switch {
		case len(found) == 0 && !logged.IsZero():
			s.log.Info("stalled shards fire again")
			logged = time.Time{}
		case len(found) > 0 && (logged.IsZero() || now.Sub(logged) >= stallLogEvery):
			parts := make([]string, len(found))
			for i, st := range found {
				parts[i] = st.String()
			}
			s.log.Warn("shards held but not firing: their due timers and waits wait on this replica",
				"stalled", len(found), "shards", strings.Join(parts, "; "))
			logged = now
		}
	}
}
