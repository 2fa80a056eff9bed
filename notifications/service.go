package notifications

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/directget"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/subjects"
)

// DefaultMax is how many notifications an agent keeps when Config.Max is
// not set (Agent Zero's max_notifications).
const DefaultMax = 100

// casAttempts bounds the read-modify-write of one notification against
// writers that keep changing it.
const casAttempts = 16

// compactTimeout bounds one agent's compaction (a read, a CAS and a purge).
const compactTimeout = 10 * time.Second

// readTimeout bounds one read of the store when the caller's context sets
// no deadline.
const readTimeout = 10 * time.Second

// Config configures a Service.
type Config struct {
	JS jetstream.JetStream
	// KV is the notifications bucket (engine.NotificationsBucket).
	KV jetstream.KeyValue
	// Max is how many notifications an agent keeps; the oldest go beyond
	// it. Zero is DefaultMax.
	Max int
	Now func() time.Time
	Log *slog.Logger
	// SanitizeDetail, when set, makes each notification's HTML detail
	// safe to put in a page: histories and feeds fill detail_html with it
	// as they read each notification; the stored detail stays as sent.
	SanitizeDetail func(html string) string
}

// Service stores notifications, answers histories, and serves the feeds.
type Service struct {
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	stream string // the bucket's stream
	prefix string // its subjects' prefix, "$KV.<bucket>."
	max    int
	now    func() time.Time
	log    *slog.Logger
	direct *directget.Stream // reads the bucket's stream
	// sanitize fills detail_html (nil: none).
	sanitize func(string) string
	loaded   chan struct{}

	// mu guards what follows: the agents whose removal markers are due
	// for compaction (see compactor) and the bucket's stream handle.
	mu  sync.Mutex
	due map[string]struct{}
	st  jetstream.Stream
	// wake tells the compactor that due has agents (buffered, one).
	wake      chan struct{}
	cancel    context.CancelFunc
	done      chan struct{}
	startOnce sync.Once
	stopOnce  sync.Once
}

// New returns a Service; Start begins its compactor.
func New(c Config) *Service {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	log := c.Log.With("component", "notifications")
	s := &Service{
		js: c.JS, kv: c.KV, stream: "KV_" + c.KV.Bucket(), prefix: "$KV." + c.KV.Bucket() + ".",
		max: cmp.Or(c.Max, DefaultMax), now: c.Now, log: log, sanitize: c.SanitizeDetail,
		loaded: make(chan struct{}), due: map[string]struct{}{}, wake: make(chan struct{}, 1), done: make(chan struct{}),
	}
	s.direct = directget.New(c.JS, s.stream, directget.WithRetry(bounded))
	close(s.loaded)
	return s
}

// Start begins compacting removal markers; it does not block.
func (s *Service) Start(ctx context.Context) error {
	s.startOnce.Do(func() {
		var cctx context.Context
		cctx, s.cancel = context.WithCancel(ctx)
		go func() {
			defer close(s.done)
			s.compactor(cctx)
		}()
	})
	return nil
}

// Loaded is closed: nothing is loaded, every answer is read from the
// bucket (kept for callers that waited for a view).
func (s *Service) Loaded() <-chan struct{} { return s.loaded }

// Stop ends the compactor; the feeds stay open until their callers close
// them. It is idempotent and safe without Start.
func (s *Service) Stop(context.Context) error {
	s.stopOnce.Do(func() {
		s.startOnce.Do(func() {}) // a Start after Stop starts nothing
		if s.cancel != nil {
			s.cancel()
			<-s.done
		}
	})
	return nil
}

// Notify stores a notification of the agent and returns it as stored.
// One with the ID of a notification the agent has replaces it in place:
// its fields, a fresh timestamp, unread again, at its place in the
// history.
func (s *Service) Notify(ctx context.Context, agentID string, n *Notification) (*NotificationItem, error) {
	am, err := s.ensureAgent(ctx, agentID)
	if err != nil {
		return nil, err
	}
	guid := am.guid
	item := NotificationItem{
		ID: cmp.Or(n.ID, newUUID()), Type: n.Type, Priority: n.Priority, Title: n.Title, Message: n.Message,
		Detail: n.Detail, Timestamp: subjects.FormatISO(s.now().UTC()), DisplayTime: n.DisplayTime, Group: n.Group,
		AgentID: agentID,
	}
	rev, err := s.put(ctx, agentID, item, n.ID != "", am.reset)
	if err != nil {
		return nil, fmt.Errorf("notifications: store %s: %w", item.ID, err)
	}
	item.Seq = rev
	s.publish(NotificationChange{Seq: rev, AgentID: agentID, Op: OpUpsert, GUID: guid, Notification: &item})
	if err := s.evict(ctx, agentID, guid); err != nil {
		// Stored: the agent's next notification evicts what this one
		// could not.
		s.log.Warn("eviction beyond the limit left to the next notification", "agent_id", agentID, "err", err)
	}
	return &item, nil
}

// ensureAgent reads the agent's record, making it first if it has none.
func (s *Service) ensureAgent(ctx context.Context, agentID string) (agentMeta, error) {
	if am, err := s.readMeta(ctx, agentID); err != nil || am.guid != "" {
		return am, err
	}
	m, rev, err := kvrec.Create(ctx, s.kv, agentID, &meta{GUID: newUUID(), Reset: 1}, func(*meta) bool { return true })
	if err != nil {
		return agentMeta{}, fmt.Errorf("notifications: agent record: %w", err)
	}
	return agentMeta{guid: m.GUID, reset: resetOf(*m, rev), rev: rev}, nil
}

// put writes a notification and returns its revision. In place, it
// replaces the agent's notification of that ID by CAS, keeping its place;
// one removed, or older than the agent's last clear, is made anew.
func (s *Service) put(ctx context.Context, agentID string, item NotificationItem, inPlace bool, reset uint64) (uint64, error) {
	key := agentID + "." + item.ID
	rec := record{NotificationItem: item}
	rec.Seq, rec.AgentID = 0, "" // the revision and the key say these
	if !inPlace {
		return s.kv.Create(ctx, key, encode(rec))
	}
	for range casAttempts {
		e, err := s.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			rec.Pos = 0
			rev, err := s.kv.Create(ctx, key, encode(rec))
			if errors.Is(err, jetstream.ErrKeyExists) {
				continue
			}
			return rev, err
		}
		if err != nil {
			return 0, err
		}
		rec.Pos = 0
		if e.Revision() >= reset {
			var old record
			if json.Unmarshal(e.Value(), &old) == nil {
				rec.Pos = cmp.Or(old.Pos, e.Revision())
			}
		}
		rev, err := s.kv.Update(ctx, key, encode(rec), e.Revision())
		if conflict(err) {
			continue
		}
		return rev, err
	}
	return 0, kvrec.ErrContended
}

// conflict reports a CAS lost to another writer.
func conflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// evict removes the agent's oldest notifications beyond the limit (see the
// package doc), then has its removal markers compacted if they are many.
func (s *Service) evict(ctx context.Context, agentID, guid string) error {
	// Below the limit in keys (live and markers together), nothing is
	// evicted: counted without reading the notifications.
	n, err := s.count(ctx, agentID)
	if err != nil || n <= uint64(s.max) {
		return err
	}
	made := 0 // the markers this eviction made
	var snap *snapshot
	for range 3 {
		if snap, err = s.read(ctx, agentID); err != nil {
			return err
		}
		lost := false
		for _, v := range snap.victims(s.max) {
			seq, err := s.remove(ctx, agentID, v)
			if errors.Is(err, errChanged) {
				lost = true // evicted by another replica, or just changed
				continue
			}
			if err != nil {
				return err
			}
			made++
			s.publish(NotificationChange{Seq: seq, AgentID: agentID, Op: OpRemove, GUID: guid, NotificationIDs: []string{v.id}})
		}
		if !lost {
			break
		}
		// Look again at what the others did.
	}
	if made > 0 && len(snap.markers)+made > 2*s.max {
		s.compactLater(agentID)
	}
	return nil
}

// compactLater has the compactor compact the agent's removal markers.
// The notify that finds them due does not wait for it: a compaction is a
// read, a CAS and a purge that scans the agent's span of the stream, and
// nothing a reader sees depends on when it runs (the reset point is
// raised first).
func (s *Service) compactLater(agentID string) {
	s.mu.Lock()
	s.due[agentID] = struct{}{}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default: // already woken: it takes every agent due when it runs
	}
}

// compactor compacts the agents due, one at a time, until ctx ends. One
// at a time keeps the purges, which hold the stream while they scan, from
// piling up on the server; an agent due again while it waits is queued
// once. Agents left due at a stop are compacted after their next
// eviction.
func (s *Service) compactor(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		}
		s.mu.Lock()
		due := s.due
		s.due = map[string]struct{}{}
		s.mu.Unlock()
		for agentID := range due {
			cctx, cancel := context.WithTimeout(ctx, compactTimeout)
			err := s.compact(cctx, agentID)
			cancel()
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				s.log.Warn("removal markers kept until the agent's next eviction", "agent_id", agentID, "err", err)
			}
		}
	}
}

var errChanged = errors.New("notification changed since the view saw it")

// remove deletes one notification with a marker, expecting the revision
// the view saw, and returns the marker's sequence. It publishes what
// KeyValue.Delete does, for the sequence Delete does not return.
func (s *Service) remove(ctx context.Context, agentID string, t target) (uint64, error) {
	m := nats.NewMsg(s.prefix + agentID + "." + t.id)
	m.Header.Set("KV-Operation", "DEL")
	ack, err := s.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(t.rev))
	if apiErr, ok := errors.AsType[*jetstream.APIError](err); ok && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		return 0, errChanged
	}
	if err != nil {
		return 0, fmt.Errorf("notifications: evict %s: %w", t.id, err)
	}
	return ack.Sequence, nil
}

// compact purges the agent's older removal markers once they are many:
// the reset point is raised past them first, so a reader whose since is
// among them is answered with the whole list rather than miss a removal.
func (s *Service) compact(ctx context.Context, agentID string) error {
	snap, err := s.read(ctx, agentID)
	if err != nil {
		return err
	}
	upTo, guid := snap.compaction(s.max), snap.guid
	if upTo == 0 {
		return nil
	}
	_, changed, err := kvrec.Update(ctx, s.kv, agentID, false, func(m *meta) (bool, error) {
		// A clear since makes this moot; a reset of 0 is a clear's own
		// revision, older than every marker kept after it.
		if m.GUID != guid || m.Reset >= upTo {
			return false, nil
		}
		m.Reset = upTo
		return true, nil
	})
	if err != nil || !changed {
		return err
	}
	return s.purge(ctx, agentID, upTo+1)
}

// purge removes the agent's notification messages below seq: no live
// notification is among them (see compact and Clear).
func (s *Service) purge(ctx context.Context, agentID string, below uint64) error {
	st, err := s.handle(ctx)
	if err == nil {
		err = st.Purge(ctx, jetstream.WithPurgeSubject(s.prefix+agentID+".*"), jetstream.WithPurgeSequence(below))
	}
	if err != nil {
		return fmt.Errorf("notifications: purge %s below %d: %w", agentID, below, err)
	}
	return nil
}

// handle is the bucket's stream, looked up once: a purge needs only its
// name, and a lookup is one more request (a STREAM.INFO) before each.
func (s *Service) handle(ctx context.Context) (jetstream.Stream, error) {
	s.mu.Lock()
	st := s.st
	s.mu.Unlock()
	if st != nil {
		return st, nil
	}
	st, err := s.js.Stream(ctx, s.stream)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.st = st
	s.mu.Unlock()
	return st, nil
}

// List returns the agent's history (see subjects.ListNotificationsReply),
// read from the bucket: the stream's last change at the call is in it.
func (s *Service) List(ctx context.Context, agentID string, since *uint64) (*ListNotificationsReply, error) {
	snap, err := s.read(ctx, agentID)
	if err != nil {
		return nil, err
	}
	return s.history(snap, since), nil
}

// Counts are how many notifications an agent has, and how many unread.
type Counts struct {
	Total, Unread int
}

// Agents returns the counts of every agent with notifications, read from
// the bucket: every agent's record, then every notification (their read
// flag). It costs the whole bucket, once per call, and holds only the
// counts.
func (s *Service) Agents(ctx context.Context) (map[string]Counts, error) {
	resets := map[string]uint64{}
	err := s.scan(ctx, "*", 1, func(m stored) error {
		if !m.deleted {
			am, err := decodeMeta(m.data, m.seq)
			if err != nil {
				am.reset = 1 // not chime's: as readMeta reads it
			}
			resets[m.key] = am.reset
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("notifications: agents: %w", err)
	}
	out := map[string]Counts{}
	err = s.scan(ctx, "*.*", 1, func(m stored) error {
		agentID, _, _ := strings.Cut(m.key, ".")
		if m.deleted || m.seq < resets[agentID] {
			return nil
		}
		var r struct {
			Read bool `json:"read"`
		}
		if json.Unmarshal(m.data, &r) != nil {
			return nil
		}
		c := out[agentID]
		c.Total++
		if !r.Read {
			c.Unread++
		}
		out[agentID] = c
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("notifications: agents: %w", err)
	}
	return out, nil
}

// MarkRead marks the agent's notifications read, all of them or those of
// ids, and returns how many were unread (Agent Zero's count).
func (s *Service) MarkRead(ctx context.Context, agentID string, ids []string, all bool) (int, error) {
	snap, err := s.read(ctx, agentID)
	if err != nil {
		return 0, err
	}
	marked := 0
	for _, t := range snap.unread(ids, all) {
		item, err := s.markRead(ctx, agentID, t.id, snap.reset)
		if err != nil {
			return marked, err
		}
		if item != nil {
			marked++
			s.publish(NotificationChange{Seq: item.Seq, AgentID: agentID, Op: OpUpsert, GUID: snap.guid, Notification: item})
		}
	}
	return marked, nil
}

// markRead marks one notification read by CAS; nil when it was read, or
// gone, already.
func (s *Service) markRead(ctx context.Context, agentID, id string, reset uint64) (*NotificationItem, error) {
	key := agentID + "." + id
	for range casAttempts {
		e, err := s.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("notifications: mark %s read: %w", id, err)
		}
		var rec record
		if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.Read || e.Revision() < reset {
			return nil, nil
		}
		rec.Read, rec.Pos = true, cmp.Or(rec.Pos, e.Revision())
		rev, err := s.kv.Update(ctx, key, encode(rec), e.Revision())
		if conflict(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("notifications: mark %s read: %w", id, err)
		}
		item := rec.NotificationItem
		item.Seq, item.AgentID = rev, agentID
		return &item, nil
	}
	return nil, fmt.Errorf("notifications: mark %s read: %w", id, kvrec.ErrContended)
}

// Clear removes every notification of the agent and gives it a new guid,
// which it returns.
func (s *Service) Clear(ctx context.Context, agentID string) (string, error) {
	guid := newUUID()
	_, rev, _, err := kvrec.UpdateRev(ctx, s.kv, agentID, true, func(m *meta) (bool, error) {
		m.GUID, m.Reset = guid, 0
		return true, nil
	})
	if err != nil {
		return "", fmt.Errorf("notifications: clear: %w", err)
	}
	s.publish(NotificationChange{Seq: rev, AgentID: agentID, Op: OpClear, GUID: guid})
	// The guid's revision already hides everything older; the purge only
	// frees the space, and the next clear or compaction retries it.
	if err := s.purge(ctx, agentID, rev); err != nil {
		s.log.Warn("cleared notifications kept until the next purge", "agent_id", agentID, "err", err)
	}
	return guid, nil
}

// publish sends a change on agent.<id>.notifications, for UIs on NATS. It
// is core NATS, at most once: a UI that must not miss one follows the
// history or an SSE feed, which carry the same changes.
func (s *Service) publish(c NotificationChange) {
	if c.Notification != nil {
		item := *c.Notification
		s.render(&item)
		c.Notification = &item
	}
	if err := s.js.Conn().Publish(subjects.Agent(c.AgentID, ActionNotifications), encodeChange(c)); err != nil {
		s.log.Debug("change not published", "agent_id", c.AgentID, "seq", c.Seq, "err", err)
	}
}

func encode(r record) []byte {
	b, err := json.Marshal(r)
	if err != nil {
		panic("notifications: encode a record: " + err.Error()) // plain fields: cannot fail
	}
	return b
}

// newUUID returns a random (version 4) UUID, the form of Agent Zero's
// notification IDs and guids.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
