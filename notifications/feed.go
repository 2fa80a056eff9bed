package notifications

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"
)

// Event is one change of the feed: its sequence (the SSE id) and its JSON.
type Event struct {
	Seq  uint64
	Data []byte
}

// feedBuffer is how many changes a feed holds for a client that has not
// written them yet; beyond it, once the feed is live, the feed is dropped
// (the client replays).
const feedBuffer = 4096

// feedAgents bounds the agents whose guid and reset point a feed keeps;
// beyond it they are forgotten and read again as of the change that
// needs them (see follower.agent).
const feedAgents = 4096

// Feed is one follower of the changes, in sequence order: what it asked
// to catch up on, then the live changes, all on C. C is closed when the
// feed is dropped (too slow once live), fails, or is closed.
type Feed struct {
	// Replay is kept for callers that write a replay first; the replay
	// now comes on C, read from the store as the client takes it.
	Replay []Event
	C      <-chan Event
	c      chan Event
	cancel context.CancelFunc
	done   chan struct{}
	// dropped is set when the feed fell behind.
	dropped atomic.Bool
	once    sync.Once
}

// Close ends the feed. It is idempotent.
func (f *Feed) Close() {
	f.once.Do(func() {
		f.cancel()
		<-f.done
	})
}

// Dropped reports whether the feed ended because its client fell behind.
func (f *Feed) Dropped() bool { return f.dropped.Load() }

// follower is a feed's reading of the bucket: an ordered consumer of the
// followed agent's keys (every key for all agents), and what it keeps of
// each agent it has sent a change of.
type follower struct {
	s      *Service
	f      *Feed
	agents map[string]*followed
	live   bool // caught up with the stream once: a full buffer drops the feed
	clears []NotificationChange
}

// Follow starts a feed of the agent's changes ("": every agent's),
// replaying those after since first when it is set: for each agent a
// clear when since is below its reset point, then its notifications and
// removals after since, each at its latest change, in sequence order
// (see Feed). The caller closes it. The feed reads the bucket itself, from
// since on: a replica holds nothing of the agents followed but their guid
// and reset point.
func (s *Service) Follow(ctx context.Context, agentID string, since *uint64) (*Feed, error) {
	filter := []string{s.prefix + ">"}
	if agentID != "" {
		filter = []string{s.prefix + agentID, s.prefix + agentID + ".*"}
	}
	fw := &follower{s: s, agents: map[string]*followed{}, live: since == nil}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: filter, DeliverPolicy: jetstream.DeliverNewPolicy}
	if since != nil {
		// The agents whose record changed after since: their reset points
		// say which replayed changes are gone, and which agents get a
		// clear first.
		metas := agentID
		if metas == "" {
			metas = "*"
		}
		err := s.scan(ctx, metas, *since+1, func(m stored) error {
			if m.deleted {
				return nil
			}
			am, err := decodeMeta(m.data, m.seq)
			if err != nil {
				s.log.Warn("unreadable agent notification record passed over", "key", m.key, "err", err)
				return nil
			}
			a := &followed{agentMeta: am}
			fw.agents[m.key] = a
			if *since < am.reset && am.reset > 1 {
				a.announced = true
				fw.clears = append(fw.clears, NotificationChange{Seq: am.reset, AgentID: m.key, Op: OpClear, GUID: am.guid})
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		slices.SortFunc(fw.clears, func(a, b NotificationChange) int { return cmp.Compare(a.Seq, b.Seq) })
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, *since+1
	}
	cons, err := s.js.OrderedConsumer(ctx, s.stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("notifications: follow: %w", err)
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("notifications: follow: %w", err)
	}
	c := make(chan Event, feedBuffer)
	fctx, cancel := context.WithCancel(ctx)
	f := &Feed{C: c, c: c, cancel: cancel, done: make(chan struct{})}
	fw.f = f
	go func() {
		<-fctx.Done()
		it.Stop()
	}()
	go func() {
		defer close(f.done)
		defer close(f.c)
		defer cancel()
		if err := fw.run(fctx, it); err != nil && fctx.Err() == nil {
			s.log.Warn("notification feed ended", "agent_id", agentID, "err", err)
		}
	}()
	return f, nil
}

// run sends the consumer's changes until the feed ends.
func (fw *follower) run(ctx context.Context, it jetstream.MessagesContext) error {
	// A clear to replay comes with its agent's record, changed after
	// since: the consumer delivers it, so the clears go out in order
	// among the messages.
	for {
		m, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return err
		}
		md, err := m.Metadata()
		if err != nil {
			continue
		}
		e := stored{key: strings.TrimPrefix(m.Subject(), fw.s.prefix), seq: md.Sequence.Stream, data: m.Data()}
		op := m.Headers().Get("KV-Operation")
		e.deleted = op == "DEL" || op == "PURGE"
		if !fw.flushClears(ctx, e.seq) {
			return nil
		}
		ch, err := fw.change(ctx, e)
		if err != nil {
			return err
		}
		if ch != nil && !fw.send(ctx, *ch) {
			return nil
		}
		if md.NumPending == 0 {
			if !fw.flushClears(ctx, 1<<64-1) {
				return nil
			}
			fw.live = true
		}
	}
}

// flushClears sends the replay's clears below seq. It is false when the
// feed ended.
func (fw *follower) flushClears(ctx context.Context, seq uint64) bool {
	for len(fw.clears) > 0 && fw.clears[0].Seq < seq {
		if !fw.send(ctx, fw.clears[0]) {
			return false
		}
		fw.clears = fw.clears[1:]
	}
	return true
}

// send hands a change to the client: waiting for it during the replay,
// dropping the feed once live when its buffer is full. It is false when
// the feed ended.
func (fw *follower) send(ctx context.Context, c NotificationChange) bool {
	ev := Event{Seq: c.Seq, Data: encodeChange(c)}
	if fw.live {
		select {
		case fw.f.c <- ev:
			return true
		default:
			fw.f.dropped.Store(true)
			return false
		}
	}
	select {
	case fw.f.c <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

// followed is what a feed knows of an agent: its record as last read,
// and whether the replay's clear stands for that record's own change.
type followed struct {
	agentMeta
	announced bool
}

// agent is what the feed knows of the agent, reading its record when it
// knows nothing. The record read may be newer than the change at hand:
// then either its reset point is above the change (the change is gone,
// passed over) or it is a compaction's, which keeps the guid.
func (fw *follower) agent(ctx context.Context, agentID string) (*followed, error) {
	if a := fw.agents[agentID]; a != nil {
		return a, nil
	}
	// Forgotten only once live: the replay's clears stand for the
	// records read before it.
	if fw.live && len(fw.agents) >= feedAgents {
		clear(fw.agents)
	}
	am, err := fw.s.readMeta(ctx, agentID)
	if err != nil {
		return nil, err
	}
	a := &followed{agentMeta: am}
	fw.agents[agentID] = a
	return a, nil
}

// change is the change a message of the bucket makes, nil for none.
func (fw *follower) change(ctx context.Context, e stored) (*NotificationChange, error) {
	agentID, id, isNotification := strings.Cut(e.key, ".")
	a, err := fw.agent(ctx, agentID)
	if err != nil {
		return nil, err
	}
	if !isNotification {
		if e.deleted { // removed by hand: the agent starts afresh
			*a = followed{}
			return nil, nil
		}
		var m meta
		if err := json.Unmarshal(e.data, &m); err != nil {
			fw.s.log.Warn("unreadable agent notification record passed over", "key", e.key, "err", err)
			return nil, nil
		}
		// A clear writes a record whose reset point is its own revision
		// (0); a compaction's names a sequence, and a first record 1. The
		// replay's clear already stood for the record it read.
		cleared := m.Reset == 0 && !(a.announced && a.rev == e.seq)
		a.guid, a.rev, a.announced = m.GUID, e.seq, false
		a.reset = max(a.reset, resetOf(m, e.seq))
		if cleared {
			return &NotificationChange{Seq: e.seq, AgentID: agentID, Op: OpClear, GUID: m.GUID}, nil
		}
		return nil, nil
	}
	if e.seq < a.reset || (e.deleted && e.seq == a.reset) {
		return nil, nil // cleared or compacted, its purge still to come
	}
	if e.deleted {
		return &NotificationChange{Seq: e.seq, AgentID: agentID, Op: OpRemove, GUID: a.guid, NotificationIDs: []string{id}}, nil
	}
	var r record
	if err := json.Unmarshal(e.data, &r); err != nil {
		fw.s.log.Warn("unreadable notification passed over", "key", e.key, "err", err)
		return nil, nil
	}
	item := r.NotificationItem
	item.ID, item.Seq, item.AgentID = id, e.seq, agentID
	fw.s.render(&item)
	return &NotificationChange{Seq: e.seq, AgentID: agentID, Op: OpUpsert, GUID: a.guid, Notification: &item}, nil
}
