package notifications

import (
	"cmp"
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/chime-nats/chime/internal/kvwatch"
	"github.com/chime-nats/chime/subjects"
)

// meta is an agent's record, key <agent>: its guid, and the reset point
// below which a reader's since is answered with the whole list.
type meta struct {
	GUID string `json:"guid"`
	// Reset: 0 is the record's own revision (a clear), else a sequence
	// (1 for an agent never cleared; a compaction's last purged marker).
	Reset uint64 `json:"reset,omitempty"`
}

// record is a stored notification. Pos keeps its place in the history
// across updates: 0 is the record's own revision (never updated since it
// was made).
type record struct {
	subjects.NotificationItem
	Pos uint64 `json:"pos,omitempty"`
}

// entry is a live notification in the view.
type entry struct {
	item subjects.NotificationItem // Seq: its revision
	pos  uint64
}

// agentView is one agent's notifications as the view holds them.
type agentView struct {
	guid    string
	reset   uint64
	entries map[string]*entry
	markers map[string]uint64 // removed notification ID -> the removal's sequence
}

// Event is one change of the feed: its sequence (the SSE id) and its JSON.
type Event struct {
	Seq  uint64
	Data []byte
}

// feedBuffer is how many changes a feed holds for a client that has not
// written them yet; beyond it the feed is dropped (the client replays).
const feedBuffer = 4096

// Feed is one follower of the changes: Replay (what it asked to catch up
// on), then C, in sequence order. C is closed when the feed is dropped
// (too slow) or closed.
type Feed struct {
	Replay []Event
	C      <-chan Event
	c      chan Event
	agent  string // "": every agent
	idx    *index
	once   sync.Once
	// dropped is set, under the index lock, when the feed fell behind.
	dropped bool
}

// Close ends the feed. It is idempotent.
func (f *Feed) Close() { f.idx.unsubscribe(f) }

// Dropped reports whether the feed ended because its client fell behind.
func (f *Feed) Dropped() bool {
	f.idx.mu.Lock()
	defer f.idx.mu.Unlock()
	return f.dropped
}

// index is a replica's view of the bucket and the hub of its feeds.
type index struct {
	log      *slog.Logger
	sanitize func(string) string // nil: no detail_html
	mu       sync.Mutex
	seen     uint64
	agents   map[string]*agentView
	feeds    map[*Feed]struct{}
}

func newIndex(log *slog.Logger, sanitize func(string) string) *index {
	return &index{log: log, sanitize: sanitize, agents: map[string]*agentView{}, feeds: map[*Feed]struct{}{}}
}

// render fills the item's detail_html, when the view sanitizes.
func (x *index) render(item *subjects.NotificationItem) {
	if x.sanitize != nil && item.Detail != "" {
		item.DetailHTML = x.sanitize(item.Detail)
	}
}

func (x *index) view(agentID string) *agentView {
	a := x.agents[agentID]
	if a == nil {
		a = &agentView{entries: map[string]*entry{}, markers: map[string]uint64{}}
		x.agents[agentID] = a
	}
	return a
}

// reset forgets everything: the bucket was made anew.
func (x *index) reset() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.agents, x.seen = map[string]*agentView{}, 0
}

// apply folds one message of the bucket into the view and sends the
// change it makes to the feeds.
func (x *index) apply(e kvwatch.Entry) {
	agentID, id, isNotification := strings.Cut(e.Key, ".")
	x.mu.Lock()
	defer x.mu.Unlock()
	x.seen = max(x.seen, e.Revision)
	if !isNotification {
		x.applyMeta(agentID, e)
		return
	}
	a := x.view(agentID)
	if e.Revision < a.reset {
		return // cleared, its purge still to come
	}
	if e.Deleted {
		delete(a.entries, id)
		a.markers[id] = e.Revision
		x.emit(subjects.NotificationChange{Seq: e.Revision, AgentID: agentID, Op: subjects.OpRemove, GUID: a.guid, NotificationIDs: []string{id}})
		return
	}
	var r record
	if err := json.Unmarshal(e.Value, &r); err != nil {
		x.log.Warn("unreadable notification passed over", "key", e.Key, "err", err)
		return
	}
	item := r.NotificationItem
	item.Seq, item.AgentID = e.Revision, agentID
	x.render(&item)
	a.entries[id] = &entry{item: item, pos: cmp.Or(r.Pos, e.Revision)}
	delete(a.markers, id)
	x.emit(subjects.NotificationChange{Seq: e.Revision, AgentID: agentID, Op: subjects.OpUpsert, GUID: a.guid, Notification: &item})
}

func (x *index) applyMeta(agentID string, e kvwatch.Entry) {
	if e.Deleted { // removed by hand: the agent starts afresh
		delete(x.agents, agentID)
		return
	}
	var m meta
	if err := json.Unmarshal(e.Value, &m); err != nil {
		x.log.Warn("unreadable agent notification record passed over", "key", e.Key, "err", err)
		return
	}
	a := x.view(agentID)
	cleared := a.guid != "" && m.GUID != a.guid
	a.guid = m.GUID
	if reset := cmp.Or(m.Reset, e.Revision); reset > a.reset {
		a.reset = reset
		maps.DeleteFunc(a.entries, func(_ string, n *entry) bool { return n.item.Seq < reset })
		maps.DeleteFunc(a.markers, func(_ string, seq uint64) bool { return seq <= reset })
	}
	if cleared {
		x.emit(subjects.NotificationChange{Seq: e.Revision, AgentID: agentID, Op: subjects.OpClear, GUID: m.GUID})
	}
}

// emit sends a change to the feeds that follow its agent. A feed whose
// buffer is full is dropped: blocking here would stall every feed and the
// view itself.
func (x *index) emit(c subjects.NotificationChange) {
	if len(x.feeds) == 0 {
		return
	}
	ev := Event{Seq: c.Seq, Data: encodeChange(c)}
	for f := range x.feeds {
		if f.agent != "" && f.agent != c.AgentID {
			continue
		}
		select {
		case f.c <- ev:
		default:
			f.dropped = true
			x.drop(f)
		}
	}
}

func (x *index) drop(f *Feed) {
	delete(x.feeds, f)
	f.once.Do(func() { close(f.c) })
}

func (x *index) unsubscribe(f *Feed) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.drop(f)
}

func encodeChange(c subjects.NotificationChange) []byte {
	b, err := json.Marshal(c)
	if err != nil {
		panic("notifications: encode a change: " + err.Error()) // plain fields: cannot fail
	}
	return b
}

// subscribe starts a feed of agentID's changes ("": every agent's). With
// since, the feed first replays what changed after it: for each agent, a
// clear when since is below its reset point, then its notifications and
// removals after since, in sequence order. Registering under the lock
// that apply holds makes the live changes follow the replay exactly.
func (x *index) subscribe(agentID string, since *uint64) *Feed {
	c := make(chan Event, feedBuffer)
	f := &Feed{C: c, c: c, agent: agentID, idx: x}
	x.mu.Lock()
	defer x.mu.Unlock()
	if since != nil {
		var changes []subjects.NotificationChange
		if agentID != "" {
			if a := x.agents[agentID]; a != nil {
				changes = a.changesSince(agentID, *since)
			}
		} else {
			for id, a := range x.agents {
				changes = append(changes, a.changesSince(id, *since)...)
			}
		}
		slices.SortFunc(changes, func(a, b subjects.NotificationChange) int { return cmp.Compare(a.Seq, b.Seq) })
		for _, ch := range changes {
			f.Replay = append(f.Replay, Event{Seq: ch.Seq, Data: encodeChange(ch)})
		}
	}
	x.feeds[f] = struct{}{}
	return f
}

// changesSince is what a follower at since needs to catch up.
func (a *agentView) changesSince(agentID string, since uint64) []subjects.NotificationChange {
	var out []subjects.NotificationChange
	if since < a.reset && a.reset > 1 {
		out = append(out, subjects.NotificationChange{Seq: a.reset, AgentID: agentID, Op: subjects.OpClear, GUID: a.guid})
	}
	for _, n := range a.entries {
		if n.item.Seq > since {
			item := n.item
			out = append(out, subjects.NotificationChange{Seq: item.Seq, AgentID: agentID, Op: subjects.OpUpsert, GUID: a.guid, Notification: &item})
		}
	}
	for id, seq := range a.markers {
		if seq > since {
			out = append(out, subjects.NotificationChange{Seq: seq, AgentID: agentID, Op: subjects.OpRemove, GUID: a.guid, NotificationIDs: []string{id}})
		}
	}
	return out
}

// list answers a history: see subjects.ListNotificationsReply.
func (x *index) counts() map[string]Counts {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make(map[string]Counts, len(x.agents))
	for id, a := range x.agents {
		if len(a.entries) == 0 {
			continue
		}
		c := Counts{Total: len(a.entries)}
		for _, e := range a.entries {
			if !e.item.Read {
				c.Unread++
			}
		}
		out[id] = c
	}
	return out
}

func (x *index) list(agentID string, since *uint64) *subjects.ListNotificationsReply {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := &subjects.ListNotificationsReply{Notifications: []subjects.NotificationItem{}, Seq: x.seen}
	a := x.agents[agentID]
	if a == nil {
		return out
	}
	out.GUID = a.guid
	from := uint64(0)
	if since != nil {
		if *since < a.reset {
			out.Cleared = true
		} else {
			from = *since
		}
	}
	for _, n := range a.sorted() {
		if n.item.Seq > from {
			out.Notifications = append(out.Notifications, n.item)
		}
	}
	if since != nil && !out.Cleared {
		for id, seq := range a.markers {
			if seq > from {
				out.Removed = append(out.Removed, id)
			}
		}
		slices.SortFunc(out.Removed, func(p, q string) int { return cmp.Compare(a.markers[p], a.markers[q]) })
	}
	out.Count = len(out.Notifications)
	return out
}

// sorted is the agent's live notifications in history order, oldest first.
func (a *agentView) sorted() []*entry {
	out := slices.Collect(maps.Values(a.entries))
	slices.SortFunc(out, func(p, q *entry) int { return cmp.Compare(p.pos, q.pos) })
	return out
}

// target is a notification the view holds, at the revision it saw.
type target struct {
	id  string
	rev uint64
}

// guid is the agent's guid, empty when the view has no record of it.
func (x *index) guid(agentID string) string {
	x.mu.Lock()
	defer x.mu.Unlock()
	if a := x.agents[agentID]; a != nil {
		return a.guid
	}
	return ""
}

// resetPoint is the agent's reset point: a stored notification whose
// revision is below it is gone.
func (x *index) resetPoint(agentID string) uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	if a := x.agents[agentID]; a != nil {
		return a.reset
	}
	return 0
}

// victims are the agent's oldest notifications beyond limit.
func (x *index) victims(agentID string, limit int) []target {
	x.mu.Lock()
	defer x.mu.Unlock()
	a := x.agents[agentID]
	if a == nil || len(a.entries) <= limit {
		return nil
	}
	var out []target
	for _, n := range a.sorted()[:len(a.entries)-limit] {
		out = append(out, target{id: n.item.ID, rev: n.item.Seq})
	}
	return out
}

// unread are the agent's live notifications not yet read: all of them, or
// those among ids.
func (x *index) unread(agentID string, ids []string, all bool) []target {
	x.mu.Lock()
	defer x.mu.Unlock()
	a := x.agents[agentID]
	if a == nil {
		return nil
	}
	var out []target
	add := func(n *entry) {
		if n != nil && !n.item.Read && !slices.ContainsFunc(out, func(t target) bool { return t.id == n.item.ID }) {
			out = append(out, target{id: n.item.ID, rev: n.item.Seq})
		}
	}
	if all {
		for _, n := range a.sorted() {
			add(n)
		}
	}
	for _, id := range ids {
		add(a.entries[id])
	}
	return out
}

// markers is how many removal markers the view holds for the agent.
func (x *index) markers(agentID string) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	if a := x.agents[agentID]; a != nil {
		return len(a.markers)
	}
	return 0
}

// compaction returns the sequence up to which the agent's removal markers
// may be purged, and the guid it holds for: 0 while it keeps no more than
// twice limit. It keeps the newest limit markers and every marker newer
// than the oldest live notification, so a reader it leaves behind can
// only have known notifications evicted since (see the package doc).
func (x *index) compaction(agentID string, limit int) (uint64, string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	a := x.agents[agentID]
	if a == nil || len(a.markers) <= 2*limit {
		return 0, ""
	}
	oldest := uint64(1<<64 - 1)
	for _, n := range a.entries {
		oldest = min(oldest, n.item.Seq)
	}
	seqs := slices.Sorted(maps.Values(a.markers))
	var upTo uint64
	for _, seq := range seqs[:len(seqs)-limit] {
		if seq >= oldest {
			break
		}
		upTo = seq
	}
	return upTo, a.guid
}
