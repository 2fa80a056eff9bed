package notifications

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/kvwatch"
	"github.com/chime-nats/chime/subjects"
)

// DefaultMax is how many notifications an agent keeps when Config.Max is
// not set (Agent Zero's max_notifications).
const DefaultMax = 100

// casAttempts bounds the read-modify-write of one notification against
// writers that keep changing it.
const casAttempts = 16

// compactTimeout bounds one agent's compaction (a CAS and a purge).
const compactTimeout = 10 * time.Second

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
	// safe to put in a page: the view fills detail_html with it, once per
	// change, for the histories and feeds; the stored detail stays as sent.
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
	idx    *index
	watch  *kvwatch.Watch

	// mu guards what follows: the agents whose removal markers are due
	// for compaction (see compactor) and the bucket's stream handle.
	mu  sync.Mutex
	due map[string]uint64 // agent -> the newest marker its compaction must see
	st  jetstream.Stream
	// wake tells the compactor that due has agents (buffered, one).
	wake      chan struct{}
	cancel    context.CancelFunc
	done      chan struct{}
	startOnce sync.Once
	stopOnce  sync.Once
}

// New returns a Service; Start begins its view.
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
		max: cmp.Or(c.Max, DefaultMax), now: c.Now, log: log, idx: newIndex(log, c.SanitizeDetail),
		due: map[string]uint64{}, wake: make(chan struct{}, 1), done: make(chan struct{}),
	}
	s.watch = kvwatch.New(kvwatch.Config{JS: c.JS, Bucket: c.KV.Bucket(), Apply: s.idx.apply, Reset: s.idx.reset, Log: c.Log})
	return s
}

// Start begins watching the bucket and compacting removal markers; it
// does not block (see Loaded).
func (s *Service) Start(ctx context.Context) error {
	s.startOnce.Do(func() {
		var cctx context.Context
		cctx, s.cancel = context.WithCancel(ctx)
		go func() {
			defer close(s.done)
			s.compactor(cctx)
		}()
	})
	return s.watch.Start(ctx)
}

// Loaded is closed once the view holds what the bucket held at start.
func (s *Service) Loaded() <-chan struct{} { return s.watch.Loaded() }

// Stop ends the view and the compactor; the feeds stay open until their
// callers close them. It is idempotent.
func (s *Service) Stop() {
	s.stopOnce.Do(func() {
		s.startOnce.Do(func() {}) // a Start after Stop starts nothing
		if s.cancel != nil {
			s.cancel()
			<-s.done
		}
	})
	s.watch.Stop()
}

// Notify stores a notification of the agent and returns it as stored.
// One with the ID of a notification the agent has replaces it in place:
// its fields, a fresh timestamp, unread again, at its place in the
// history.
func (s *Service) Notify(ctx context.Context, agentID string, n *subjects.Notification) (*subjects.NotificationItem, error) {
	guid, err := s.ensureAgent(ctx, agentID)
	if err != nil {
		return nil, err
	}
	item := subjects.NotificationItem{
		ID: cmp.Or(n.ID, newUUID()), Type: n.Type, Priority: n.Priority, Title: n.Title, Message: n.Message,
		Detail: n.Detail, Timestamp: subjects.FormatISO(s.now().UTC()), DisplayTime: n.DisplayTime, Group: n.Group,
		AgentID: agentID,
	}
	rev, err := s.put(ctx, agentID, item, n.ID != "")
	if err != nil {
		return nil, fmt.Errorf("notifications: store %s: %w", item.ID, err)
	}
	item.Seq = rev
	s.publish(subjects.NotificationChange{Seq: rev, AgentID: agentID, Op: subjects.OpUpsert, GUID: guid, Notification: &item})
	if err := s.watch.WaitSeen(ctx, rev); err != nil {
		return nil, fmt.Errorf("notifications: %w", err)
	}
	if err := s.evict(ctx, agentID, guid); err != nil {
		// Stored: the agent's next notification evicts what this one
		// could not.
		s.log.Warn("eviction beyond the limit left to the next notification", "agent_id", agentID, "err", err)
	}
	return &item, nil
}

// ensureAgent returns the agent's guid, making its record first if it
// has none.
func (s *Service) ensureAgent(ctx context.Context, agentID string) (string, error) {
	if g := s.idx.guid(agentID); g != "" {
		return g, nil
	}
	m, rev, err := kvrec.Create(ctx, s.kv, agentID, &meta{GUID: newUUID(), Reset: 1}, func(*meta) bool { return true })
	if err != nil {
		return "", fmt.Errorf("notifications: agent record: %w", err)
	}
	if err := s.watch.WaitSeen(ctx, rev); err != nil {
		return "", fmt.Errorf("notifications: %w", err)
	}
	return m.GUID, nil
}

// put writes a notification and returns its revision. In place, it
// replaces the agent's notification of that ID by CAS, keeping its place;
// one removed, or older than the agent's last clear, is made anew.
func (s *Service) put(ctx context.Context, agentID string, item subjects.NotificationItem, inPlace bool) (uint64, error) {
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
		if e.Revision() >= s.idx.resetPoint(agentID) {
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
	made, last := 0, uint64(0) // the markers this eviction made, the newest's sequence
	for range 3 {
		victims := s.idx.victims(agentID, s.max)
		lost := false
		for _, v := range victims {
			seq, err := s.remove(ctx, agentID, v)
			if errors.Is(err, errChanged) {
				lost = true // evicted by another replica, or just changed
				continue
			}
			if err != nil {
				return err
			}
			made, last = made+1, seq
			s.publish(subjects.NotificationChange{Seq: seq, AgentID: agentID, Op: subjects.OpRemove, GUID: guid, NotificationIDs: []string{v.id}})
		}
		if !lost {
			break
		}
		// Catch up with what the others did, and look again.
		if err := s.catchUp(ctx); err != nil {
			return err
		}
	}
	// The view may not hold the markers just made yet: counted twice at
	// worst, which only has the compactor look once for nothing.
	if made > 0 && s.idx.markers(agentID)+made > 2*s.max {
		s.compactLater(agentID, last)
	}
	return nil
}

// compactLater has the compactor compact the agent's removal markers
// once the view holds the marker at seq. The notify that finds them due
// does not wait for it: a compaction is a CAS and a purge that scans the
// agent's span of the stream, and nothing a reader sees depends on when
// it runs (the reset point is raised first).
func (s *Service) compactLater(agentID string, seq uint64) {
	s.mu.Lock()
	s.due[agentID] = max(s.due[agentID], seq)
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
		s.due = map[string]uint64{}
		s.mu.Unlock()
		for agentID, seq := range due {
			cctx, cancel := context.WithTimeout(ctx, compactTimeout)
			err := s.watch.WaitSeen(cctx, seq)
			if err == nil {
				err = s.compact(cctx, agentID)
			}
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
	upTo, guid := s.idx.compaction(agentID, s.max)
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
// as of the stream's last change at least.
func (s *Service) List(ctx context.Context, agentID string, since *uint64) (*subjects.ListNotificationsReply, error) {
	if err := s.catchUp(ctx); err != nil {
		return nil, err
	}
	return s.idx.list(agentID, since), nil
}

// Counts are how many notifications an agent has, and how many unread.
type Counts struct {
	Total, Unread int
}

// Agents returns the counts of every agent with notifications, once the
// view holds what the bucket held at the call (as List).
func (s *Service) Agents(ctx context.Context) (map[string]Counts, error) {
	if err := s.catchUp(ctx); err != nil {
		return nil, err
	}
	return s.idx.counts(), nil
}

// MarkRead marks the agent's notifications read, all of them or those of
// ids, and returns how many were unread (Agent Zero's count).
func (s *Service) MarkRead(ctx context.Context, agentID string, ids []string, all bool) (int, error) {
	if err := s.catchUp(ctx); err != nil {
		return 0, err
	}
	guid := s.idx.guid(agentID)
	marked := 0
	for _, t := range s.idx.unread(agentID, ids, all) {
		item, err := s.markRead(ctx, agentID, t.id)
		if err != nil {
			return marked, err
		}
		if item != nil {
			marked++
			s.publish(subjects.NotificationChange{Seq: item.Seq, AgentID: agentID, Op: subjects.OpUpsert, GUID: guid, Notification: item})
		}
	}
	return marked, nil
}

// markRead marks one notification read by CAS; nil when it was read, or
// gone, already.
func (s *Service) markRead(ctx context.Context, agentID, id string) (*subjects.NotificationItem, error) {
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
		if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.Read || e.Revision() < s.idx.resetPoint(agentID) {
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
	s.publish(subjects.NotificationChange{Seq: rev, AgentID: agentID, Op: subjects.OpClear, GUID: guid})
	if err := s.watch.WaitSeen(ctx, rev); err != nil {
		return "", fmt.Errorf("notifications: %w", err)
	}
	// The guid's revision already hides everything older; the purge only
	// frees the space, and the next clear or compaction retries it.
	if err := s.purge(ctx, agentID, rev); err != nil {
		s.log.Warn("cleared notifications kept until the next purge", "agent_id", agentID, "err", err)
	}
	return guid, nil
}

// Follow starts a feed of the agent's changes ("": every agent's),
// replaying those after since first when it is set (see Feed). The caller
// closes it. A resume first brings the view up to the stream's last
// change: the client may come from a replica further on, and a view behind
// its since would send again, live, changes it has (an older state of a
// notification after a newer one).
func (s *Service) Follow(ctx context.Context, agentID string, since *uint64) (*Feed, error) {
	if since != nil {
		if err := s.catchUp(ctx); err != nil {
			return nil, err
		}
	}
	return s.idx.subscribe(agentID, since), nil
}

// catchUp waits until the view holds the stream's last change, so that
// what any replica wrote before is answered.
func (s *Service) catchUp(ctx context.Context) error {
	st, err := s.js.Stream(ctx, s.stream)
	if err != nil {
		return fmt.Errorf("notifications: %w", err)
	}
	if err := s.watch.WaitSeen(ctx, st.CachedInfo().State.LastSeq); err != nil {
		return fmt.Errorf("notifications: %w", err)
	}
	return nil
}

// publish sends a change on agent.<id>.notifications, for UIs on NATS. It
// is core NATS, at most once: a UI that must not miss one follows the
// history or an SSE feed, which carry the same changes.
func (s *Service) publish(c subjects.NotificationChange) {
	if c.Notification != nil {
		item := *c.Notification
		s.idx.render(&item)
		c.Notification = &item
	}
	if err := s.js.Conn().Publish(subjects.Agent(c.AgentID, subjects.ActionNotifications), encodeChange(c)); err != nil {
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
