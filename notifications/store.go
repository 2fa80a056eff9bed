package notifications

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/directget"
)

// Reads from the store. Nothing of an agent is held between requests:
// each reads the agent's own keys with batched direct gets filtered by its
// subjects (the server finds them through its per-subject index, so the
// cost is the agent's keys, not the bucket's), served by any server that
// holds the stream, without a consumer.

// scanBatch bounds one direct get's messages and scanBytes its bytes; an
// agent with more is read in several.
const (
	scanBatch = 1000
	scanBytes = 8 << 20
)

// stored is one message of the bucket as a read returns it.
type stored struct {
	key     string // the key: the subject less the bucket's prefix
	seq     uint64
	deleted bool // a delete or purge marker
	data    []byte
}

// stored is the message m of the bucket.
func (s *Service) stored(m *directget.Msg) stored {
	return stored{key: strings.TrimPrefix(m.Subject, s.prefix), seq: m.Seq, deleted: m.Deleted(), data: m.Data}
}

// bounded runs a direct get's one attempt, bounded by readTimeout when
// the caller's context sets no deadline.
func bounded(ctx context.Context, attempt func(context.Context) (*directget.Answer, error)) (*directget.Answer, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, readTimeout)
		defer cancel()
	}
	return attempt(ctx)
}

// scan calls fn for every message of the bucket from sequence from on
// whose subject matches filter (a key, or keys with wildcards), in
// sequence order. The bucket keeps one message per key, so these are the
// keys' last changes. Each batch is one consistent read; between batches
// a key that changes moves past where the scan is, so it is read again at
// its new place (the later read wins).
func (s *Service) scan(ctx context.Context, filter string, from uint64, fn func(stored) error) error {
	req := directget.Request{Seq: from, NextFor: s.prefix + filter, Batch: scanBatch, MaxBytes: scanBytes}
	if err := s.direct.Walk(ctx, req, func(m *directget.Msg) error { return fn(s.stored(m)) }); err != nil {
		return fmt.Errorf("notifications: %w", err)
	}
	return nil
}

// count is how many messages of the agent's notification keys the bucket
// holds (live ones and removal markers: one each), read without their
// bodies but for one.
func (s *Service) count(ctx context.Context, agentID string) (uint64, error) {
	a, err := s.direct.Get(ctx, directget.Request{Seq: 1, NextFor: s.prefix + agentID + ".*", Batch: 1})
	if err != nil {
		return 0, fmt.Errorf("notifications: %w", err)
	}
	return uint64(len(a.Msgs)) + a.Pending, nil
}

// agentMeta is an agent's record as read: its guid, reset point (a
// stored notification below it is gone) and revision.
type agentMeta struct {
	guid       string
	reset, rev uint64
}

// readMeta reads the agent's record; a zero agentMeta when it has none.
func (s *Service) readMeta(ctx context.Context, agentID string) (agentMeta, error) {
	e, err := s.kv.Get(ctx, agentID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return agentMeta{}, nil
	}
	if err != nil {
		return agentMeta{}, fmt.Errorf("notifications: agent record: %w", err)
	}
	am, err := decodeMeta(e.Value(), e.Revision())
	if err != nil {
		// Not chime's: read as a record never cleared, so that the
		// agent's notifications still show.
		s.log.Warn("unreadable agent notification record passed over", "agent_id", agentID, "err", err)
		return agentMeta{reset: 1, rev: e.Revision()}, nil
	}
	return am, nil
}

func decodeMeta(data []byte, rev uint64) (agentMeta, error) {
	var m meta
	if err := json.Unmarshal(data, &m); err != nil {
		return agentMeta{}, fmt.Errorf("notifications: agent record at %d: %w", rev, err)
	}
	return agentMeta{guid: m.GUID, reset: cmp.Or(m.Reset, rev), rev: rev}, nil
}

// snapshot is one agent's notifications as read from the store.
type snapshot struct {
	agentMeta
	live    []entry  // in history order, oldest first
	markers []marker // in sequence order
	// last is a sequence the read covers: every change of the agent at or
	// below it is in the snapshot.
	last uint64
}

type marker struct {
	id  string
	seq uint64
}

// read reads the agent's notifications: the stream's last sequence, then
// every key of the agent in one subject-filtered scan, then its record,
// so that the record read is at least as new as every notification read
// (one older than its reset point is gone: a clear or compaction whose
// purge is still to come).
func (s *Service) read(ctx context.Context, agentID string) (*snapshot, error) {
	st, err := s.js.Stream(ctx, s.stream)
	if err != nil {
		return nil, fmt.Errorf("notifications: %w", err)
	}
	snap := &snapshot{last: st.CachedInfo().State.LastSeq}
	var live []entry
	var markers []marker
	err = s.scan(ctx, agentID+".*", 1, func(m stored) error {
		_, id, _ := strings.Cut(m.key, ".")
		snap.last = max(snap.last, m.seq)
		if m.deleted {
			markers = append(markers, marker{id: id, seq: m.seq})
			return nil
		}
		var r record
		if err := json.Unmarshal(m.data, &r); err != nil {
			s.log.Warn("unreadable notification passed over", "key", m.key, "err", err)
			return nil
		}
		item := r.NotificationItem
		item.ID, item.Seq, item.AgentID = id, m.seq, agentID
		live = append(live, entry{item: item, pos: cmp.Or(r.Pos, m.seq)})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("notifications: read %s: %w", agentID, err)
	}
	if snap.agentMeta, err = s.readMeta(ctx, agentID); err != nil {
		return nil, err
	}
	// A scan spanning batches reads a key changed meanwhile twice: the
	// later read wins.
	newest := make(map[string]uint64, len(live)+len(markers))
	for _, e := range live {
		newest[e.item.ID] = max(newest[e.item.ID], e.item.Seq)
	}
	for _, m := range markers {
		newest[m.id] = max(newest[m.id], m.seq)
	}
	for _, e := range live {
		if e.item.Seq >= snap.reset && newest[e.item.ID] == e.item.Seq {
			snap.live = append(snap.live, e)
		}
	}
	for _, m := range markers {
		if m.seq > snap.reset && newest[m.id] == m.seq {
			snap.markers = append(snap.markers, m)
		}
	}
	slices.SortStableFunc(snap.live, func(p, q entry) int { return cmp.Compare(p.pos, q.pos) })
	return snap, nil
}
