package notifications

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/chime-nats/chime/subjects"
	"strconv"
	"strings"
)

// Notification actions besides notify: a history (agents their own,
// operators any), and the operators' mark-read and clear. The change feed
// is published on agent.<id>.notifications (ActionNotifications).
const (
	ActionNotifications       = "notifications"
	ActionNotificationsList   = "notifications.list"
	ActionNotificationsMark   = "notifications.mark_read"
	ActionNotificationsClear  = "notifications.clear"
	ActionNotificationsCreate = "notifications.create" // HTTP only: the console's create, with HTTP defaults
)

// Texts of Agent Zero's notification routes, kept exact.
const (
	NotificationCreatedText = "Notification created successfully"
	NoNotificationIDsText   = "No notification IDs provided"
	NotificationIDsListText = "notification_ids must be a list"
	AllMarkedReadText       = "All notifications marked as read"
	AllClearedText          = "All notifications cleared"
)

// MarkedReadText is Agent Zero's reply to a mark-read of n notifications.
func MarkedReadText(n int) string { return fmt.Sprintf("Marked %d notifications as read", n) }

// NotificationItem is a stored notification as every surface shows it:
// Agent Zero's fields (its to_dict) plus the agent and the update
// sequence of its last change.
type NotificationItem struct {
	ID       string               `json:"id"`
	Type     NotificationType     `json:"type"`
	Priority NotificationPriority `json:"priority"`
	Title    string               `json:"title"`
	Message  string               `json:"message"`
	Detail   string               `json:"detail"` // HTML, as sent
	// DetailHTML is Detail made safe to put in a page (the console's
	// sanitizer), set by the view that answers histories and feeds, never
	// stored.
	DetailHTML  string  `json:"detail_html,omitempty"`
	Timestamp   string  `json:"timestamp"`
	DisplayTime float64 `json:"display_time"`
	Read        bool    `json:"read"`
	Group       string  `json:"group"`
	AgentID     string  `json:"agent_id"`
	Seq         uint64  `json:"seq"`
}

// Change operations of the notification feed.
const (
	OpUpsert = "upsert"
	OpRemove = "remove"
	OpClear  = "clear"
)

// NotificationChange is one change of an agent's notifications, as the
// SSE streams and agent.<id>.notifications carry it. Seq is the update
// sequence: a follower that applies changes in Seq order, skipping any
// at or below the last it applied, never goes backwards. A clear says
// to forget every notification of the agent older than Seq.
type NotificationChange struct {
	Seq             uint64            `json:"seq"`
	AgentID         string            `json:"agent_id"`
	Op              string            `json:"op"`
	GUID            string            `json:"guid"`
	Notification    *NotificationItem `json:"notification,omitempty"`
	NotificationIDs []string          `json:"notification_ids,omitempty"`
}

// NotifyReply answers agent.<id>.notify.
type NotifyReply struct {
	ID      string `json:"id"`
	Message string `json:"message"`
}

// CreateNotificationReply answers the HTTP create (Agent Zero's
// notification_create).
type CreateNotificationReply struct {
	Success        bool   `json:"success"`
	NotificationID string `json:"notification_id"`
	Message        string `json:"message"`
}

// ListNotificationsRequest is the body of agent.<id>.notifications.list.
type ListNotificationsRequest struct {
	// Since, when set, asks only for what changed after that sequence.
	Since *uint64 `json:"since,omitempty"`
}

// ListNotificationsReply is an agent's notifications, oldest first
// (newest last, as Agent Zero's history). Seq is the highest sequence
// the answer covers: ask again with since=Seq. With since, Notifications
// are those changed after it and Removed those removed after it; Cleared
// says the answer is the whole list instead (the agent was cleared after
// since, or since is older than the removals kept): replace, not merge.
type ListNotificationsReply struct {
	Notifications []NotificationItem `json:"notifications"`
	GUID          string             `json:"guid"`
	Count         int                `json:"count"`
	Seq           uint64             `json:"seq"`
	Removed       []string           `json:"removed,omitempty"`
	Cleared       bool               `json:"cleared,omitempty"`
}

// DecodeListNotifications decodes a history request; nil since asks for
// the whole history.
func DecodeListNotifications(data []byte) (since *uint64, err error) {
	var r struct {
		Since json.RawMessage `json:"since,omitempty"`
	}
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return nil, err
	}
	if subjects.IsNull(r.Since) {
		return nil, nil
	}
	n, err := strconv.ParseUint(string(bytes.TrimSpace(r.Since)), 10, 64)
	if err != nil {
		return nil, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "since must be a sequence number (a whole number, 0 or more), not " + rawText(r.Since)}
	}
	return &n, nil
}

// MarkReadRequest is the body of a mark-read: notification_ids stays raw
// so that Agent Zero's checks, not JSON's types, answer it.
type MarkReadRequest struct {
	NotificationIDs json.RawMessage `json:"notification_ids,omitempty"`
	MarkAll         bool            `json:"mark_all,omitempty"`
}

// MarkReadReply answers a mark-read; MarkedCount is absent for mark_all,
// as in Agent Zero.
type MarkReadReply struct {
	Success     bool   `json:"success"`
	MarkedCount *int   `json:"marked_count,omitempty"`
	Message     string `json:"message"`
}

// ClearReply answers a clear; GUID is the agent's new one.
type ClearReply struct {
	Success bool   `json:"success"`
	Message string `json:"message"`
	GUID    string `json:"guid"`
}

// DecodeMarkRead checks a mark-read in Agent Zero's order: mark_all wins;
// then ids that are absent or empty (null, [], "", 0, false, {}) are
// `No notification IDs provided`; then anything but a list is
// `notification_ids must be a list`. Entries that are not non-blank
// strings are passed over, as Agent Zero does; all false means "these
// ids".
func DecodeMarkRead(data []byte) (ids []string, all bool, err error) {
	var r MarkReadRequest
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return nil, false, err
	}
	if r.MarkAll {
		return nil, true, nil
	}
	raw := bytes.TrimSpace(r.NotificationIDs)
	if falsy(raw) {
		return nil, false, subjects.Invalid(NoNotificationIDsText)
	}
	var list []json.RawMessage
	if raw[0] != '[' || json.Unmarshal(raw, &list) != nil {
		return nil, false, subjects.Invalid(NotificationIDsListText)
	}
	for _, e := range list {
		var s string
		if json.Unmarshal(e, &s) == nil && strings.TrimSpace(s) != "" {
			ids = append(ids, s)
		}
	}
	return ids, false, nil
}

// falsy reports a JSON value Python reads as false: absent, null, false,
// zero, an empty string, list or object.
func falsy(raw []byte) bool {
	switch string(raw) {
	case "", "null", "false", `""`, "[]", "{}":
		return true
	}
	var f float64
	if json.Unmarshal(raw, &f) == nil && f == 0 {
		return true
	}
	var empty []any
	if json.Unmarshal(raw, &empty) == nil && len(empty) == 0 {
		return true
	}
	var obj map[string]any
	return json.Unmarshal(raw, &obj) == nil && len(obj) == 0
}
