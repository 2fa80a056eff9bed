package callbacks

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"mime"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/subjects"
	jsonv2 "github.com/go-json-experiment/json"
)

// Agent lifecycle and trigger actions (agent.<id>.<action>).
const (
	ActionLifecycleStart = "lifecycle.start"
	ActionLifecycleStop  = "lifecycle.stop"
	ActionTriggerCreate  = "trigger.create"
	ActionTriggerCancel  = "trigger.cancel"
	ActionTriggerList    = "trigger.list"
	// ActionTriggerReset revokes an agent's default trigger of a mode and
	// issues a new one (HTTP: POST /api/control/agents/{id}/reset-callback).
	ActionTriggerReset = "trigger.reset"
)

// Callback error codes.
const (
	CodeTriggerNotFound = "trigger_not_found"
	CodeAgentNotActive  = "agent_not_active"
)

// ErrCallbackRejected is the one answer to a callback with a bad token, a
// revoked one, the other mode's route or a stopped agent: nothing in it
// tells a guesser which.
var ErrCallbackRejected = &subjects.Error{Code: subjects.CodeForbidden, Message: "callback rejected"}

// Callback sentinels for errors.Is.
var (
	ErrTriggerNotFound = &subjects.Error{Code: CodeTriggerNotFound}
	ErrAgentNotActive  = &subjects.Error{Code: CodeAgentNotActive}
)

// MaxCallbackBody is the largest callback body accepted (256 KiB).
const MaxCallbackBody = 256 << 10

// DeliveryMode is what a trigger's callbacks become in the inbox.
type DeliveryMode string

// Delivery modes.
const (
	ModeWakeHint       DeliveryMode = "wake_hint"
	ModeEnqueueMessage DeliveryMode = "enqueue_message"
)

// DeliveryModes lists every mode; an agent gets a default trigger of each.
func DeliveryModes() []DeliveryMode { return []DeliveryMode{ModeWakeHint, ModeEnqueueMessage} }

// Route is the HTTP path segment of the mode's ingress route.
func (m DeliveryMode) Route() string {
	if m == ModeWakeHint {
		return "wake"
	}
	return "enqueue"
}

// EventSubject is where accepted callbacks of the mode are stored.
func (m DeliveryMode) EventSubject() string {
	if m == ModeWakeHint {
		return subjects.CallbackEventWake
	}
	return subjects.CallbackEventEnqueue
}

// ParseMode validates a delivery mode; empty means def.
func ParseMode(s string, def DeliveryMode) (DeliveryMode, error) {
	if s == "" {
		return def, nil
	}
	for _, m := range DeliveryModes() {
		if string(m) == s {
			return m, nil
		}
	}
	return "", subjects.Invalid("delivery_mode must be wake_hint or enqueue_message, not " + s)
}

// TriggerStatus is where a trigger is in its life.
type TriggerStatus string

// Trigger statuses.
const (
	TriggerActive  TriggerStatus = "active"
	TriggerRevoked TriggerStatus = "revoked"
)

// Trigger is an external trigger record. The token itself is never
// stored: only its SHA-256, to look it up and compare.
type Trigger struct {
	ID        string        `json:"external_trigger_id"`
	AgentID   string        `json:"agent_id"`
	Mode      DeliveryMode  `json:"delivery_mode"`
	Label     string        `json:"label,omitempty"`
	Default   bool          `json:"default"`
	Status    TriggerStatus `json:"status"`
	TokenHash string        `json:"token_hash"`
	CreatedAt time.Time     `json:"created_at"`
	RevokedAt *time.Time    `json:"revoked_at,omitempty"`
}

// Revoked reports whether the trigger is revoked. Revoked records are
// removed after the record retention.
func (t *Trigger) Revoked() bool { return t.Status == TriggerRevoked }

// TriggerView is a trigger as shown to callers: no hash, and the URL only
// where the token is at hand (when it is issued).
type TriggerView struct {
	ID         string        `json:"external_trigger_id"`
	AgentID    string        `json:"agent_id"`
	Mode       DeliveryMode  `json:"delivery_mode"`
	Label      string        `json:"label,omitempty"`
	Default    bool          `json:"default"`
	Status     TriggerStatus `json:"status"`
	TriggerURL string        `json:"trigger_url,omitempty"`
	CreatedAt  time.Time     `json:"created_at"`
	RevokedAt  *time.Time    `json:"revoked_at,omitempty"`
}

// View returns the public view of t.
func (t *Trigger) View() TriggerView {
	return TriggerView{ID: t.ID, AgentID: t.AgentID, Mode: t.Mode, Label: t.Label, Default: t.Default,
		Status: t.Status, CreatedAt: t.CreatedAt, RevokedAt: t.RevokedAt}
}

// TriggerURL is the ingress URL of a token on publicURL.
func TriggerURL(publicURL string, mode DeliveryMode, token string) string {
	return strings.TrimRight(publicURL, "/") + "/api/callbacks/" + mode.Route() + "/" + token
}

// CreateTriggerRequest is the body of agent.<id>.trigger.create.
type CreateTriggerRequest struct {
	Mode  string `json:"delivery_mode"`
	Label string `json:"label,omitempty"`
}

// MaxLabelLen bounds a trigger label.
const MaxLabelLen = 200

// Validate checks the request; the mode defaults to wake_hint.
func (r *CreateTriggerRequest) Validate() (DeliveryMode, error) {
	if len(r.Label) > MaxLabelLen {
		return "", subjects.Invalid("label must be at most 200 bytes")
	}
	return ParseMode(r.Mode, ModeWakeHint)
}

// DecodeCreateTrigger decodes and validates a trigger.create body.
func DecodeCreateTrigger(data []byte) (DeliveryMode, string, error) {
	var r CreateTriggerRequest
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return "", "", err
	}
	mode, err := r.Validate()
	return mode, r.Label, err
}

// ResetTriggerRequest is the body of a reset: which default to replace.
type ResetTriggerRequest struct {
	Mode string `json:"delivery_mode,omitempty"`
}

// DecodeResetTrigger decodes a trigger.reset body and returns the mode
// whose default is replaced (wake_hint when absent).
func DecodeResetTrigger(data []byte) (DeliveryMode, error) {
	var r ResetTriggerRequest
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return "", err
	}
	return ParseMode(r.Mode, ModeWakeHint)
}

// TriggerRef names a trigger.
type TriggerRef struct {
	ID string `json:"external_trigger_id"`
}

// Validate checks the trigger ID.
func (r *TriggerRef) Validate() error { return subjects.ValidateID("external_trigger_id", r.ID) }

// DecodeTriggerRef decodes a trigger.cancel body and returns the trigger ID.
func DecodeTriggerRef(data []byte) (string, error) {
	var r TriggerRef
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return "", err
	}
	return r.ID, r.Validate()
}

// TriggerNotFound is the error for an unknown trigger.
func TriggerNotFound(id string) *subjects.Error {
	return &subjects.Error{Code: CodeTriggerNotFound, Message: "trigger " + id + " not found"}
}

// LifecycleReply answers lifecycle.start and stop. Start's triggers carry
// their URLs: the reply goes only to the agent that asked.
type LifecycleReply struct {
	AgentID  string             `json:"agent_id"`
	Status   agents.AgentStatus `json:"status"`
	Triggers []TriggerView      `json:"triggers"`
}

// ResetReply is the reply of reset-callback.
type ResetReply struct {
	OK         bool          `json:"ok"`
	AgentID    string        `json:"agent_id"`
	TriggerID  string        `json:"external_trigger_id"`
	TriggerURL string        `json:"trigger_url"`
	Mode       DeliveryMode  `json:"delivery_mode"`
	Status     TriggerStatus `json:"status"`
}

// Callback dispositions: Holon's, and chime's duplicate.
const (
	DispositionTriggered = "triggered" // a wake stored; its wake_hint follows
	DispositionEnqueued  = "enqueued"  // a message stored; its delivery follows
	DispositionCoalesced = "coalesced" // a wake folded into the pending one
	DispositionDuplicate = "duplicate" // a retry of a stored callback (same Idempotency-Key)
)

// Accepted is the disposition of a stored callback of mode that was not
// folded into a pending wake: triggered or enqueued.
func (m DeliveryMode) Accepted() string {
	if m == ModeWakeHint {
		return DispositionTriggered
	}
	return DispositionEnqueued
}

// CallbackResult is the result of an accepted callback.
type CallbackResult struct {
	AgentID     string       `json:"agent_id"`
	TriggerID   string       `json:"external_trigger_id"`
	Mode        DeliveryMode `json:"delivery_mode"`
	Disposition string       `json:"disposition"`
}

// CallbackReply wraps the result: {ok:true, result:{...}}.
type CallbackReply struct {
	OK     bool           `json:"ok"`
	Result CallbackResult `json:"result"`
}

// Payload is a decoded callback body: at most one of its forms is set.
type Payload struct {
	Text string          `json:"text,omitempty"` // a text/* body
	JSON json.RawMessage `json:"json,omitempty"` // a JSON body, compacted
	// Any other type, kept as sent.
	ContentType string `json:"content_type,omitempty"`
	BodyBase64  string `json:"body_base64,omitempty"`
}

// Empty reports a callback without a body.
func (p *Payload) Empty() bool { return p.Text == "" && p.JSON == nil && p.BodyBase64 == "" }

// DecodeCallbackBody reads a callback body by its content type: empty is
// allowed; application/json and */*+json must be JSON under the rules of
// DecodeStrict (valid UTF-8, no duplicate keys; any kind of value); text/*
// is text (invalid UTF-8 is kept as bytes); anything else is kept as
// {content_type, body_base64}. A body without a type is JSON when it
// reads as such JSON, else bytes.
func DecodeCallbackBody(contentType string, body []byte) (*Payload, error) {
	if len(body) > MaxCallbackBody {
		return nil, subjects.BodyTooLarge("callback", MaxCallbackBody)
	}
	p := &Payload{}
	if len(bytes.TrimSpace(body)) == 0 {
		return p, nil
	}
	media, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		media = ""
	}
	switch {
	case media == "application/json" || strings.HasSuffix(media, "+json"):
		compact, err := subjects.CompactStrict(body)
		if err != nil {
			return nil, &subjects.Error{Code: subjects.CodeInvalidJSON, Message: "malformed JSON body: " + strings.TrimPrefix(subjects.AsError(err).Message, "malformed JSON: ")}
		}
		p.JSON = compact
		return p, nil
	case media == "":
		if compact, err := subjects.CompactStrict(body); err == nil {
			p.JSON = compact
			return p, nil
		}
		media = "application/octet-stream"
	case strings.HasPrefix(media, "text/") && utf8.Valid(body):
		p.Text = string(body)
		return p, nil
	}
	p.ContentType, p.BodyBase64 = media, base64.StdEncoding.EncodeToString(body)
	return p, nil
}

// maxReason is how much of a JSON body a wake hint's reason shows.
const maxReason = 160

// WakeReason is a wake hint's short reason: the text, or the JSON cut to
// 160 characters plus "...", or "external trigger fired".
func (p *Payload) WakeReason() string {
	if strings.TrimSpace(p.Text) != "" {
		return p.Text
	}
	s := string(p.JSON)
	if strings.TrimSpace(s) == "" {
		return "external trigger fired"
	}
	if r := []rune(s); len(r) > maxReason {
		return string(r[:maxReason]) + "..."
	}
	return s
}

// MessageText is an enqueued message's text: a text body, a JSON body's
// "text" string, or the JSON itself; bytes have none.
func (p *Payload) MessageText() string {
	if p.Text != "" {
		return p.Text
	}
	if p.JSON != nil {
		var v struct {
			Text *string `json:"text"`
		}
		// JSON v2: the key "text" exactly, as DecodeCallbackBody read it;
		// encoding/json would take "TEXT" too.
		if jsonv2.Unmarshal(p.JSON, &v) == nil && v.Text != nil {
			return *v.Text
		}
		return string(p.JSON)
	}
	return ""
}

// CallbackEvent is a stored, accepted callback (no token in it).
type CallbackEvent struct {
	ID          string       `json:"id"`
	AgentID     string       `json:"agent_id"`
	TriggerID   string       `json:"external_trigger_id"`
	Mode        DeliveryMode `json:"delivery_mode"`
	Disposition string       `json:"disposition"`
	// CoalescedInto is the event of the pending hint a coalesced wake
	// folded into, and FloorAtFold the agent's inbox ack floor then: if
	// that hint turns out to lie at or below it, the agent had taken it
	// already and this wake must be delivered after all.
	CoalescedInto string    `json:"coalesced_into,omitempty"`
	FloorAtFold   uint64    `json:"floor_at_fold,omitempty"`
	At            time.Time `json:"at"`
	Payload       *Payload  `json:"payload,omitempty"`
}

// CallbackData is the data of wake_hint and message deliveries.
type CallbackData struct {
	TriggerID string   `json:"external_trigger_id"`
	Reason    string   `json:"reason,omitempty"`
	Payload   *Payload `json:"payload,omitempty"`
}

// WakeHintID is the envelope ID of the wake hint of callback event eventID.
func WakeHintID(eventID string) string { return "wake_" + eventID }

// CallbackEnvelope is the inbox delivery of an accepted callback. The
// payload rides in data only where the text does not already carry it.
func CallbackEnvelope(ev *CallbackEvent) subjects.Envelope {
	env := subjects.Envelope{AgentID: ev.AgentID, At: ev.At.UTC(), Source: subjects.Source{Type: "external_trigger", ID: ev.TriggerID}, Trust: subjects.TrustExternal}
	data := CallbackData{TriggerID: ev.TriggerID}
	if ev.Mode == ModeWakeHint {
		env.ID, env.Kind = WakeHintID(ev.ID), subjects.KindWakeHint
		data.Reason = ev.Payload.WakeReason()
		env.Text = data.Reason
	} else {
		env.ID, env.Kind = "msg_"+ev.ID, subjects.KindMessage
		env.Text = ev.Payload.MessageText()
	}
	if ev.Payload.BodyBase64 != "" || (ev.Payload.JSON != nil && env.Text != string(ev.Payload.JSON)) {
		data.Payload = ev.Payload
	}
	env.Data, _ = subjects.EncodeJSON(data)
	return env
}

// CallbackMsgID is the stored event's Nats-Msg-Id: the caller's
// Idempotency-Key scoped to the trigger, so a retry is stored once; without
// a key, the event's own ID.
func CallbackMsgID(triggerID, idempotencyKey, eventID string) string {
	if idempotencyKey == "" {
		return "cb:" + eventID
	}
	h := sha256.Sum256([]byte(idempotencyKey))
	return "cb:" + triggerID + ":" + hex.EncodeToString(h[:16])
}
