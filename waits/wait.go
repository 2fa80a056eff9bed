package waits

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/chime-nats/chime/interventions"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/waitfor"
)

// Wait actions, events and error codes.
const (
	ActionWaitRequest  = "wait.request"
	ActionWaitCancel   = "wait.cancel"
	ActionWaitProgress = "wait.progress"
	ActionIntervention = "intervention"

	CodeInvalidDuration  = "invalid_duration"
	CodeInvalidTimestamp = "invalid_timestamp"
	CodeTargetInPast     = "target_in_past"
	CodeInvalidTimezone  = "invalid_timezone"
	CodeWaitNotFound     = "wait_not_found"
	CodeWaitExists       = "wait_exists"
)

// Wait sentinels for errors.Is.
var (
	ErrWaitNotFound = &subjects.Error{Code: CodeWaitNotFound}
	ErrWaitExists   = &subjects.Error{Code: CodeWaitExists}
)

// WaitMode says how a wait's target was given.
type WaitMode string

// Wait modes.
const (
	WaitDuration WaitMode = "duration"
	WaitUntil    WaitMode = "until"
)

// WaitStatus is where a wait is in its life.
type WaitStatus string

// Wait statuses.
const (
	WaitWaiting   WaitStatus = "waiting"
	WaitCompleted WaitStatus = "completed"
	WaitCancelled WaitStatus = "cancelled"
)

// WaitRequest is the body of agent.<id>.wait.request. Durations are kept raw
// so that integer conversion follows Agent Zero (int(): 1.5 -> 1).
type WaitRequest struct {
	Seconds json.RawMessage `json:"seconds,omitempty"`
	Minutes json.RawMessage `json:"minutes,omitempty"`
	Hours   json.RawMessage `json:"hours,omitempty"`
	Days    json.RawMessage `json:"days,omitempty"`
	Until   string          `json:"until,omitempty"`
	TZ      string          `json:"tz,omitempty"`
	ID      string          `json:"id,omitempty"`
	// RequestID, when set, makes a retry of this request return the wait
	// the first one made.
	RequestID *string `json:"request_id,omitempty"`
}

// WaitSpec is a validated wait request.
type WaitSpec struct {
	ID     string // empty: chime picks one
	Mode   WaitMode
	Target time.Time // in the agent's zone
	TZ     string    // the zone naive times were read in
	// Request is set when the request had a request_id.
	Request subjects.RequestKey
}

// waitRequest is a wait request in its normalized form, the one its
// request_id is bound to: what it means, not when it was sent, so a retry
// of {"seconds":30} a moment later is the same request.
type waitRequest struct {
	Mode    WaitMode `json:"mode"`
	Seconds int64    `json:"seconds,omitempty"` // the duration's total
	Until   string   `json:"until,omitempty"`   // the target instant, UTC
	TZ      string   `json:"tz"`
}

// MaxWaitSeconds keeps target arithmetic far from time.Duration overflow
// (about 292 years); no agent waits a century.
const MaxWaitSeconds = 100 * 365 * 86400

// DecodeWaitRequest decodes and validates a wait request at now. defaultTZ
// is CHIME_TIMEZONE (empty: UTC).
func DecodeWaitRequest(data []byte, now time.Time, defaultTZ string) (*WaitSpec, error) {
	var r WaitRequest
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return nil, err
	}
	return r.Resolve(now, defaultTZ)
}

// Resolve applies Agent Zero's rules: until wins when present; else the
// summed duration must be positive.
func (r *WaitRequest) Resolve(now time.Time, defaultTZ string) (*WaitSpec, error) {
	if r.ID != "" {
		if err := subjects.ValidateID("id", r.ID); err != nil {
			return nil, err
		}
	}
	if r.RequestID != nil {
		if r.ID != "" {
			// A request_id names the wait itself (its ID is derived from
			// it): with an id too, one retry could name two waits.
			return nil, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "use either id or request_id, not both"}
		}
		if err := subjects.ValidateRequestID(*r.RequestID); err != nil {
			return nil, err
		}
	}
	spec, err := r.resolve(now, defaultTZ)
	if err != nil {
		return nil, err
	}
	norm := waitRequest{Mode: spec.Mode, TZ: spec.TZ}
	if spec.Mode == WaitUntil {
		norm.Until = spec.Target.UTC().Format(time.RFC3339Nano)
	} else {
		norm.Seconds = int64(spec.Target.Sub(now) / time.Second) // the total, exactly: the target is now plus it
	}
	if spec.Request, err = subjects.NewRequestKey(r.RequestID, ActionWaitRequest, norm); err != nil {
		return nil, err
	}
	return spec, nil
}

// resolve is Resolve past the checks of id and request_id.
func (r *WaitRequest) resolve(now time.Time, defaultTZ string) (*WaitSpec, error) {
	tzName := r.TZ
	if tzName == "" {
		tzName = defaultTZ
	}
	loc, err := LoadZone(tzName)
	if err != nil {
		return nil, err
	}
	spec := &WaitSpec{ID: r.ID, TZ: loc.String()}
	if strings.TrimSpace(r.Until) != "" {
		target, err := ParseUntil(r.Until, loc)
		if err != nil {
			return nil, err
		}
		if !target.After(now) {
			return nil, &subjects.Error{Code: CodeTargetInPast, Message: fmt.Sprintf("Target time %s is in the past.", subjects.FormatISO(target))}
		}
		spec.Mode, spec.Target = WaitUntil, target
		return spec, nil
	}
	var total int64
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		unit int64
	}{{"seconds", r.Seconds, 1}, {"minutes", r.Minutes, 60}, {"hours", r.Hours, 3600}, {"days", r.Days, 86400}} {
		n, err := pyInt(f.name, f.raw)
		if err != nil {
			return nil, err
		}
		if n > MaxWaitSeconds/f.unit || n < -MaxWaitSeconds/f.unit {
			return nil, &subjects.Error{Code: CodeInvalidDuration, Message: fmt.Sprintf("%s is too large", f.name)}
		}
		total += n * f.unit
	}
	if total <= 0 {
		return nil, &subjects.Error{Code: CodeInvalidDuration, Message: "Wait duration must be positive."}
	}
	if total > MaxWaitSeconds {
		return nil, &subjects.Error{Code: CodeInvalidDuration, Message: "Wait duration is too large."}
	}
	spec.Mode, spec.Target = WaitDuration, now.Add(time.Duration(total)*time.Second).In(loc)
	return spec, nil
}

// pyInt converts a duration field as Python's int() would: numbers are
// truncated toward zero, integer strings are parsed, null or absent is 0.
func pyInt(field string, raw json.RawMessage) (int64, error) {
	s := string(bytes.TrimSpace(raw))
	if s == "" || s == "null" {
		return 0, nil
	}
	bad := &subjects.Error{Code: CodeInvalidDuration, Message: fmt.Sprintf("%s must be a number, not %s", field, s)}
	if s[0] == '"' {
		var str string
		if json.Unmarshal(raw, &str) != nil {
			return 0, bad
		}
		n, err := strconv.ParseInt(strings.TrimSpace(str), 10, 64)
		if err != nil {
			return 0, bad
		}
		return n, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || (s[0] != '-' && (s[0] < '0' || s[0] > '9')) {
		return 0, bad
	}
	if math.Abs(f) > MaxWaitSeconds {
		return 0, &subjects.Error{Code: CodeInvalidDuration, Message: fmt.Sprintf("%s is too large", field)}
	}
	return int64(f), nil // truncation toward zero, as int() does
}

// LoadZone loads an IANA zone; empty is UTC.
func LoadZone(name string) (*time.Location, error) {
	if name == "" {
		return time.UTC, nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil || name == "Local" {
		return nil, &subjects.Error{Code: CodeInvalidTimezone, Message: fmt.Sprintf("Unknown time zone: %s", name)}
	}
	return loc, nil
}

// isoLayouts are the ISO 8601 forms Python's datetime.fromisoformat reads
// that agents send, with an offset or Z, then naive.
var isoLayouts = []string{
	time.RFC3339Nano,
	"2006-01-02T15:04:05.999999999Z07",
	"2006-01-02T15:04Z07:00",
	"2006-01-02 15:04:05.999999999Z07:00",
}

var naiveLayouts = []string{
	"2006-01-02T15:04:05.999999999",
	"2006-01-02T15:04",
	"2006-01-02 15:04:05.999999999",
	"2006-01-02 15:04:05", // the three fallback formats
	"2006-01-02 15:04",
	"2006-01-02",
}

// ParseUntil reads a wait target: ISO 8601 with Z or an offset as given, a
// naive time (ISO or a fallback format) in loc.
func ParseUntil(s string, loc *time.Location) (time.Time, error) {
	v := strings.TrimSpace(s)
	for _, l := range isoLayouts {
		if t, err := time.Parse(l, v); err == nil {
			return t, nil
		}
	}
	for _, l := range naiveLayouts {
		if t, err := time.ParseInLocation(l, v, loc); err == nil {
			return t, nil
		}
	}
	return time.Time{}, &subjects.Error{Code: CodeInvalidTimestamp, Message: "Invalid timestamp format: " + s}
}

// RemainingText is Agent Zero's remaining-time text: tenths of a second
// under an hour, whole seconds once hours or days show.
func RemainingText(seconds float64) string {
	if seconds <= 0 || math.IsNaN(seconds) {
		return "0.0s remaining"
	}
	if seconds < 3600 {
		tenths := int64(math.Round(seconds * 10))
		if tenths < 36000 {
			m, rest := tenths/600, tenths%600
			switch {
			case m == 0:
				return fmt.Sprintf("%d.%ds remaining", rest/10, rest%10)
			case rest == 0:
				return fmt.Sprintf("%dm remaining", m)
			default:
				return fmt.Sprintf("%dm %d.%ds remaining", m, rest/10, rest%10)
			}
		}
		seconds = 3600 // rounds up to the hour
	}
	total := int64(seconds)
	d, h, m, s := total/86400, total%86400/3600, total%3600/60, total%60
	var parts []string
	for _, p := range []struct {
		n    int64
		unit string
	}{{d, "d"}, {h, "h"}, {m, "m"}, {s, "s"}} {
		if p.n > 0 {
			parts = append(parts, strconv.FormatInt(p.n, 10)+p.unit)
		}
	}
	return strings.Join(parts, " ") + " remaining"
}

// WaitHeading is the progress heading Agent Zero shows.
func WaitHeading(remaining string) string { return "icon://timer Wait: " + remaining }

// Wait is the record of a managed wait, stored under <agent>.<wait_id>.
type Wait struct {
	ID         string     `json:"wait_id"`
	AgentID    string     `json:"agent_id"`
	Mode       WaitMode   `json:"mode"`
	Status     WaitStatus `json:"status"`
	CreatedAt  time.Time  `json:"created_at"`
	TargetTime time.Time  `json:"target_time"` // moves later when a pause ends
	TZ         string     `json:"tz"`
	// PausedAt is set while the agent is paused; a duration wait's clock
	// does not run then.
	PausedAt    *time.Time `json:"paused_at,omitempty"`
	PausedMs    int64      `json:"paused_ms,omitempty"` // total the target moved
	EndedAt     *time.Time `json:"ended_at,omitempty"`
	CancelText  string     `json:"cancel_text,omitempty"`
	CancelledBy string     `json:"cancelled_by,omitempty"` // intervention ID, or "request"
	// RequestKey is set when the request had a request_id.
	subjects.RequestKey
}

// Ended reports whether the wait completed or was cancelled. Ended
// records are removed after the record retention.
func (w *Wait) Ended() bool { return w.Status == WaitCompleted || w.Status == WaitCancelled }

// Key is the wait's KV key.
func (w *Wait) Key() string { return WaitKey(w.AgentID, w.ID) }

// WaitKey is the KV key of a wait record: <agent>.<wait>.
func WaitKey(agentID, waitID string) string { return agentID + "." + waitID }

// Target is the target in the wait's zone, as shown to agents.
func (w *Wait) Target() time.Time {
	if loc, err := LoadZone(w.TZ); err == nil {
		return w.TargetTime.In(loc)
	}
	return w.TargetTime
}

// Remaining is the time left at now; a paused wait's clock stands still.
func (w *Wait) Remaining(now time.Time) time.Duration {
	if w.PausedAt != nil && w.Mode == WaitDuration {
		now = *w.PausedAt
	}
	return max(w.TargetTime.Sub(now), 0)
}

// Armed reports whether the wait's target should fire.
func (w *Wait) Armed() bool {
	return w.Status == WaitWaiting && !(w.Mode == WaitDuration && w.PausedAt != nil)
}

// WaitReply is the reply to wait.request.
type WaitReply struct {
	WaitID     string   `json:"wait_id"`
	TargetTime string   `json:"target_time"`
	Mode       WaitMode `json:"mode"`
}

// WaitRef names a wait, as in wait.cancel.
type WaitRef struct {
	WaitID string `json:"wait_id"`
}

// Validate checks the reference.
func (r *WaitRef) Validate() error { return subjects.ValidateID("wait_id", r.WaitID) }

// DecodeWaitRef decodes a wait.cancel body and returns the wait ID.
func DecodeWaitRef(data []byte) (string, error) {
	var r WaitRef
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return "", err
	}
	return r.WaitID, r.Validate()
}

// WaitProgress is published on agent.<id>.wait.progress about once a second.
type WaitProgress struct {
	WaitID           string  `json:"wait_id"`
	RemainingSeconds float64 `json:"remaining_seconds"`
	Remaining        string  `json:"remaining"`
	Heading          string  `json:"heading"`
	// Done marks the last progress of a wait that completed.
	Done bool `json:"done,omitempty"`
}

// WaitDoneHeading is the heading Agent Zero ends a wait's progress with.
const WaitDoneHeading = "icon://timer Wait: Done icon://done_all"

// DoneWaitProgress is the last progress message of a completed wait.
func DoneWaitProgress(waitID string) WaitProgress {
	return WaitProgress{WaitID: waitID, Remaining: RemainingText(0), Heading: WaitDoneHeading, Done: true}
}

// NewWaitProgress builds the progress message of a wait at now.
func NewWaitProgress(waitID string, remaining time.Duration) WaitProgress {
	text := RemainingText(remaining.Seconds())
	return WaitProgress{
		WaitID:           waitID,
		RemainingSeconds: math.Round(remaining.Seconds()*1000) / 1000,
		Remaining:        text,
		Heading:          WaitHeading(text),
	}
}

// WaitFired is the wait.fire event: the scheduler saw the target pass.
type WaitFired struct {
	AgentID string    `json:"agent_id"`
	WaitID  string    `json:"wait_id"`
	Target  time.Time `json:"target_time"`
	FiredAt time.Time `json:"fired_at"`
	// Rev is the revision of the wait record the scheduler fired from
	// (absent from events of older versions).
	Rev uint64 `json:"rev,omitempty"`
}

// MsgID is the event's dedup ID; a moved target is a new event.
func (f *WaitFired) MsgID() string {
	return fmt.Sprintf("%s.%s:%d", f.AgentID, f.WaitID, f.Target.UnixNano())
}

// WaitEnvelopeID is the stable ID of a wait's one terminal delivery: a wait
// ends once, completed or cancelled, never both.
func WaitEnvelopeID(waitID string) string { return "wait_" + waitID + "_end" }

// WaitEndData is the data of wait_complete and wait_cancelled deliveries.
type WaitEndData struct {
	WaitID     string   `json:"wait_id"`
	Mode       WaitMode `json:"mode"`
	TargetTime string   `json:"target_time"`
	// Reason of a cancellation: "intervention" or "request".
	Reason string `json:"reason,omitempty"`
}

// Cancellation reasons.
const (
	CancelByIntervention = "intervention"
	CancelByRequest      = "request"
)

// WaitEndEnvelope builds the one terminal delivery of an ended wait; text is
// the rendered completion text, or the cancellation text.
func WaitEndEnvelope(w *Wait, text string, at time.Time) subjects.Envelope {
	kind, reason := subjects.KindWaitComplete, ""
	if w.Status == WaitCancelled {
		kind, reason = subjects.KindWaitCancelled, CancelByIntervention
		if w.CancelledBy == CancelByRequest {
			reason = CancelByRequest
		}
	}
	data, _ := json.Marshal(WaitEndData{WaitID: w.ID, Mode: w.Mode, TargetTime: subjects.FormatISO(w.Target()), Reason: reason})
	return subjects.Envelope{
		ID: WaitEnvelopeID(w.ID), AgentID: w.AgentID, Kind: kind, At: at.UTC(),
		Source: subjects.Source{Type: "wait", ID: w.ID}, Trust: subjects.TrustSystem, Text: text, Data: data,
	}
}

// interventionDeliverySize is the size of the largest message an intervention
// makes: its event, its own inbox delivery, and the wait_cancelled
// delivery of each wait it cancels, which carries the same text (sized
// for the longest wait ID). Each must fit the connection's max payload.
func interventionDeliverySize(iv *interventions.Intervention) (int, error) {
	ev, err := subjects.EncodeJSON(iv)
	if err != nil {
		return 0, fmt.Errorf("encode intervention: %w", err)
	}
	size := len(ev)
	own := interventions.InterventionEnvelope(iv)
	at := time.Date(2999, 12, 31, 23, 59, 59, 999999999, time.UTC) // the widest timestamps
	w := &Wait{
		ID: strings.Repeat("w", subjects.MaxIDLen), AgentID: iv.AgentID, Mode: WaitDuration, Status: WaitCancelled,
		TargetTime: at, CancelledBy: iv.ID,
	}
	cancelled := WaitEndEnvelope(w, iv.CancelText(), at)
	for _, env := range []*subjects.Envelope{&own, &cancelled} {
		m, err := env.Msg()
		if err != nil {
			return 0, err
		}
		size = max(size, len(m.Data))
	}
	return size, nil
}

// ActionWaitList lists an agent's managed waits and WaitFor registrations;
// its body is a listing's, {limit?, cursor?} (DecodeListWaits), the limit
// applying to each kind.
const ActionWaitList = "wait.list"

// DecodeListWaits decodes a wait.list body: its limit and cursor, which
// holds a place in each kind's walk.
func DecodeListWaits(data []byte) (subjects.ListPage, error) {
	return subjects.DecodeListPage(ActionWaitList, 2, data)
}

// ListWaitsReply is a page of an agent's waits: managed waits
// (wait.request) and WaitFor registrations (wait.for, wait.tasks), live
// and those ended within the record retention, each in the order of their
// last change, oldest first; NextCursor as for timers.
type ListWaitsReply struct {
	Waits      []Wait            `json:"waits"`
	WaitFor    []waitfor.WaitFor `json:"wait_for"`
	NextCursor string            `json:"next_cursor"`
}
