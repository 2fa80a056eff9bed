package notifications

import (
	"bytes"
	"encoding/json"
	"github.com/chime-nats/chime/subjects"
	"math"
	"slices"
	"strconv"
	"strings"
)

// ActionNotify is the agent's request to notify its user.
const ActionNotify = "notify"

// NotificationSentText is the reply message of an accepted notification
// (Agent Zero's); prompts/fw.notification_sent.md holds the same text.
const NotificationSentText = "The notification has been sent to the user."

// NotificationType is the kind of a notice, case-sensitive on the wire.
type NotificationType string

// Notification types; info is the default.
const (
	NotifyInfo     NotificationType = "info"
	NotifySuccess  NotificationType = "success"
	NotifyWarning  NotificationType = "warning"
	NotifyError    NotificationType = "error"
	NotifyProgress NotificationType = "progress"
)

// NotificationTypes lists every accepted type, in the order prompts show them.
func NotificationTypes() []NotificationType {
	return []NotificationType{NotifyInfo, NotifySuccess, NotifyWarning, NotifyError, NotifyProgress}
}

// NotificationPriority is Agent Zero's urgency scale.
type NotificationPriority int

// Notification priorities.
const (
	PriorityNormal NotificationPriority = 10
	PriorityHigh   NotificationPriority = 20
)

// NotificationPriorities lists every accepted priority, highest first.
func NotificationPriorities() []NotificationPriority {
	return []NotificationPriority{PriorityHigh, PriorityNormal}
}

// NotifySource says who sends a notification; the defaults differ.
type NotifySource int

// Notification sources.
const (
	// FromAgent: priority high, shown 30 s unless said otherwise.
	FromAgent NotifySource = iota
	// FromHTTP: priority normal, shown 3 s.
	FromHTTP
)

func (s NotifySource) defaults() (NotificationPriority, float64) {
	if s == FromHTTP {
		return PriorityNormal, 3
	}
	return PriorityHigh, 30
}

// NotifyRequest is the body of agent.<id>.notify. Priority and the display
// times stay raw so that their own rules, not JSON's types, answer them.
type NotifyRequest struct {
	Message     string          `json:"message"`
	Title       string          `json:"title,omitempty"`
	Detail      string          `json:"detail,omitempty"`
	Type        string          `json:"type,omitempty"`
	Priority    json.RawMessage `json:"priority,omitempty"`
	Timeout     json.RawMessage `json:"timeout,omitempty"`
	DisplayTime json.RawMessage `json:"display_time,omitempty"`
	ID          string          `json:"id,omitempty"`
	Group       string          `json:"group,omitempty"`
}

// Notification is a validated notification request.
type Notification struct {
	ID          string // empty: chime picks one
	Message     string
	Title       string
	Detail      string // HTML
	Type        NotificationType
	Priority    NotificationPriority
	DisplayTime float64 // seconds
	Group       string
}

// DecodeNotify validates a notification with Agent Zero's texts, in the
// order of its source: an agent's (notify_user) type, then priority, then
// message; the HTTP create route's (notification_create) message first,
// and type without regard to case. A display time that is absent,
// non-numeric or not positive takes the source's default; timeout wins
// over display_time. Over HTTP a display time is a whole number of
// seconds, as that route's int() makes it: a number is cut to its whole
// part, a string must spell a whole number. Unlike that route, chime
// checks the priority on HTTP too (10 or 20), so that every stored
// notification has one of the two.
func DecodeNotify(data []byte, src NotifySource) (*Notification, error) {
	var req NotifyRequest
	if err := subjects.DecodeStrict(data, &req); err != nil {
		return nil, err
	}
	prio, display := src.defaults()
	n := &Notification{ID: req.ID, Message: req.Message, Title: req.Title, Detail: req.Detail,
		Type: NotifyInfo, Priority: prio, DisplayTime: display, Group: req.Group}
	if src == FromHTTP && req.Message == "" {
		return nil, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "Message is required"}
	}
	if req.Type != "" {
		n.Type = NotificationType(req.Type)
		if src == FromHTTP {
			n.Type = NotificationType(strings.ToLower(req.Type))
		}
		if !slices.Contains(NotificationTypes(), n.Type) {
			return nil, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "Invalid notification type: " + req.Type}
		}
	}
	if !subjects.IsNull(req.Priority) {
		p, err := strconv.Atoi(string(bytes.TrimSpace(req.Priority)))
		if err != nil || !slices.Contains(NotificationPriorities(), NotificationPriority(p)) {
			return nil, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "Invalid notification priority: " + rawText(req.Priority)}
		}
		n.Priority = NotificationPriority(p)
	}
	if req.Message == "" {
		return nil, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "Message is required"}
	}
	if req.ID != "" {
		if err := subjects.ValidateID("id", req.ID); err != nil {
			return nil, err
		}
	}
	for _, raw := range []json.RawMessage{req.Timeout, req.DisplayTime} {
		if f, ok := src.displayTime(raw); ok {
			n.DisplayTime = f
			break
		}
	}
	return n, nil
}

// displayTime reads a display time the source's way (see DecodeNotify);
// false: none that counts.
func (s NotifySource) displayTime(raw json.RawMessage) (float64, bool) {
	v := bytes.TrimSpace(raw)
	if s == FromHTTP {
		var text string
		if json.Unmarshal(v, &text) == nil {
			n, err := strconv.Atoi(strings.TrimSpace(text))
			return float64(n), err == nil && n > 0
		}
		f, err := strconv.ParseFloat(string(v), 64)
		f = math.Trunc(f)
		return f, err == nil && f > 0
	}
	f, err := strconv.ParseFloat(string(v), 64)
	return f, err == nil && f > 0
}

// rawText shows a raw JSON value the way the sender wrote it, a string
// without its quotes, as Agent Zero's message does.
func rawText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(bytes.TrimSpace(raw))
}
