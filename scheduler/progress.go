package scheduler

import (
	"context"
	"encoding/json"
	"time"

	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/waits"
)

// progressLoop publishes each owned waiting wait's progress about once
// every ProgressEvery, a tenth of the waits at a time so that 10k waits
// never make one burst that would delay fires. Progress is core NATS: a
// lost one is replaced by the next.
func (s *Scheduler) progressLoop(ctx context.Context) {
	tick := time.NewTicker(s.cfg.ProgressEvery / 10)
	defer tick.Stop()
	owned := make([]bool, s.cfg.Shards)
	type item struct {
		agent, wait string
		left        time.Duration
	}
	var items []item
	nc := s.cfg.JS.Conn()
	for phase := int8(0); ; phase = (phase + 1) % 10 {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := s.cfg.Now()
		s.cfg.Leases.Owned(now, owned)
		s.fireable(owned)
		items = items[:0]
		s.mu.Lock()
		for _, en := range s.index.waits {
			if en.phase != phase || !owned[en.shard] {
				continue
			}
			left := en.paused
			if left == 0 {
				left = max(time.Duration(en.due-now.UnixNano()), 0)
			}
			items = append(items, item{en.agentID(), en.itemID(), left})
		}
		s.mu.Unlock()
		for _, it := range items {
			data, err := json.Marshal(waits.NewWaitProgress(it.wait, it.left))
			if err != nil {
				continue
			}
			if err := nc.Publish(subjects.Agent(it.agent, waits.ActionWaitProgress), data); err != nil {
				s.log.Debug("progress publish", "err", err)
				continue
			}
			s.m.progress.Inc()
		}
	}
}
