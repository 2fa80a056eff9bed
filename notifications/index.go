package notifications

import (
	"cmp"
	"encoding/json"
	"slices"
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
	NotificationItem
	Pos uint64 `json:"pos,omitempty"`
}

// entry is a live notification as read.
type entry struct {
	item NotificationItem // Seq: its revision
	pos  uint64
}

// target is a notification read, at the revision read.
type target struct {
	id  string
	rev uint64
}

// history answers a history from a snapshot: see
// subjects.ListNotificationsReply.
func (s *Service) history(snap *snapshot, since *uint64) *ListNotificationsReply {
	out := &ListNotificationsReply{Notifications: []NotificationItem{}, Seq: snap.last, GUID: snap.guid}
	from := uint64(0)
	if since != nil {
		if *since < snap.reset {
			out.Cleared = true
		} else {
			from = *since
		}
	}
	for _, n := range snap.live {
		if n.item.Seq > from {
			item := n.item
			s.render(&item)
			out.Notifications = append(out.Notifications, item)
		}
	}
	if since != nil && !out.Cleared {
		for _, m := range snap.markers {
			if m.seq > from {
				out.Removed = append(out.Removed, m.id)
			}
		}
	}
	out.Count = len(out.Notifications)
	return out
}

// victims are the snapshot's oldest notifications beyond limit.
func (snap *snapshot) victims(limit int) []target {
	if len(snap.live) <= limit {
		return nil
	}
	var out []target
	for _, n := range snap.live[:len(snap.live)-limit] {
		out = append(out, target{id: n.item.ID, rev: n.item.Seq})
	}
	return out
}

// unread are the snapshot's notifications not yet read: all of them, or
// those among ids.
func (snap *snapshot) unread(ids []string, all bool) []target {
	var out []target
	add := func(n *entry) {
		if n != nil && !n.item.Read && !slices.ContainsFunc(out, func(t target) bool { return t.id == n.item.ID }) {
			out = append(out, target{id: n.item.ID, rev: n.item.Seq})
		}
	}
	if all {
		for i := range snap.live {
			add(&snap.live[i])
		}
	}
	for _, id := range ids {
		if i := slices.IndexFunc(snap.live, func(e entry) bool { return e.item.ID == id }); i >= 0 {
			add(&snap.live[i])
		}
	}
	return out
}

// compaction returns the sequence up to which the agent's removal markers
// may be purged: 0 while it keeps no more than twice limit. It keeps the
// newest limit markers and every marker newer than the oldest live
// notification, so a reader it leaves behind can only have known
// notifications evicted since (see the package doc).
func (snap *snapshot) compaction(limit int) uint64 {
	if len(snap.markers) <= 2*limit {
		return 0
	}
	oldest := uint64(1<<64 - 1)
	for _, n := range snap.live {
		oldest = min(oldest, n.item.Seq)
	}
	var upTo uint64
	for _, m := range snap.markers[:len(snap.markers)-limit] {
		if m.seq >= oldest {
			break
		}
		upTo = m.seq
	}
	return upTo
}

// render fills the item's detail_html, when the service sanitizes.
func (s *Service) render(item *NotificationItem) {
	if s.sanitize != nil && item.Detail != "" {
		item.DetailHTML = s.sanitize(item.Detail)
	}
}

func encodeChange(c NotificationChange) []byte {
	b, err := json.Marshal(c)
	if err != nil {
		panic("notifications: encode a change: " + err.Error()) // plain fields: cannot fail
	}
	return b
}

// resetOf is an agent record's reset point.
func resetOf(m meta, rev uint64) uint64 { return cmp.Or(m.Reset, rev) }
