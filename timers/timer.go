package timers

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/chime-nats/chime/subjects"
	"github.com/nats-io/nats.go"
)

// TimerStatus is the lifecycle state of a timer record.
type TimerStatus string

// Timer statuses. Legacy records may say "scheduled"; it reads as active.
const (
	TimerActive    TimerStatus = "active"
	TimerCompleted TimerStatus = "completed"
	TimerCancelled TimerStatus = "cancelled"
)

// UnmarshalJSON reads the legacy "scheduled" status as active.
func (s *TimerStatus) UnmarshalJSON(b []byte) error {
	var v string
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	if v == "scheduled" {
		v = string(TimerActive)
	}
	*s = TimerStatus(v)
	return nil
}

// Limits on timer requests.
const (
	// MaxTimerMs is the longest duration or interval: 100 years (as for
	// waits). A due time must stay within int64 nanoseconds since 1970
	// (year 2262): timers of 236+ years used to overflow and fire at once.
	MaxTimerMs = 100 * 365 * 24 * int64(time.Hour/time.Millisecond)
	// MaxSummaryLen bounds the summary, which travels in every fire.
	MaxSummaryLen = 4096
)

// Timer is the stored timer record (Holon's shape).
type Timer struct {
	ID             string      `json:"id"`
	AgentID        string      `json:"agent_id"`
	CreatedAt      time.Time   `json:"created_at"`
	DurationMs     int64       `json:"duration_ms"`
	IntervalMs     *int64      `json:"interval_ms"`
	Repeat         bool        `json:"repeat"`
	Status         TimerStatus `json:"status"`
	Summary        string      `json:"summary"`
	NextFireAt     *time.Time  `json:"next_fire_at"`
	LastFiredAt    *time.Time  `json:"last_fired_at"`
	FireCount      int64       `json:"fire_count"`
	AuthorityClass string      `json:"authority_class,omitempty"`
	// Note is the note of the last pause or resume that gave one.
	Note string `json:"note,omitempty"`
	// RequestKey is set when the create had a request_id.
	subjects.RequestKey
	// CalendarSpec is set for a calendar timer (see calendar.go).
	CalendarSpec
}

// Finished reports whether the timer will never fire again: completed or
// cancelled. Finished records are removed after the record retention.
func (t *Timer) Finished() bool { return t.Status == TimerCompleted || t.Status == TimerCancelled }

// Interval is the repeat interval, zero for a one-shot timer.
func (t *Timer) Interval() time.Duration {
	if t.IntervalMs == nil {
		return 0
	}
	return time.Duration(*t.IntervalMs) * time.Millisecond
}

// FireText is the text of the timer_fired delivery.
func (t *Timer) FireText() string {
	if t.Summary != "" {
		return t.Summary
	}
	return "timer " + t.ID + " fired"
}

// CreateTimerRequest is the body of agent.<id>.timer.create and of the HTTP
// create route. Numbers are kept raw so that fractions, overflow and
// strings are each rejected with their own message.
type CreateTimerRequest struct {
	DurationMs     json.RawMessage `json:"duration_ms"`
	IntervalMs     json.RawMessage `json:"interval_ms"`
	Summary        string          `json:"summary"`
	AuthorityClass string          `json:"authority_class"`
	// RequestID, when set, makes a retry of this create return the timer
	// the first one made.
	RequestID *string `json:"request_id"`
	// The calendar form (see calendar.go): cron instead of duration_ms
	// and interval_ms.
	Cron            string          `json:"cron"`
	TZ              string          `json:"tz"`
	DSTRepeated     string          `json:"dst_repeated"`
	DSTSkipped      string          `json:"dst_skipped"`
	CatchUp         string          `json:"catchup"`
	CatchUpWindowMs json.RawMessage `json:"catchup_window_ms"`
	Jitter          *float64        `json:"jitter"`
	JitterMaxMs     json.RawMessage `json:"jitter_max_ms"`
	StartAt         *string         `json:"start_at"`
	EndAt           *string         `json:"end_at"`
	MaxFires        json.RawMessage `json:"max_fires"`
}

// TimerSpec is a validated create request.
type TimerSpec struct {
	Duration       time.Duration
	Interval       time.Duration // zero: one-shot
	Summary        string
	AuthorityClass string
	// Request is set when the create had a request_id.
	Request subjects.RequestKey
	// Calendar is set, its defaults filled in, for a calendar timer.
	Calendar CalendarSpec
}

// timerRequest is a create request in its normalized form, the one its
// request_id is bound to.
type timerRequest struct {
	DurationMs     int64  `json:"duration_ms"`
	IntervalMs     int64  `json:"interval_ms"`
	Summary        string `json:"summary"`
	AuthorityClass string `json:"authority_class"`
	CalendarSpec
}

// TimerLimits are the operator's bounds on a create request, passed in
// so that decoding needs no state of its own.
type TimerLimits struct {
	// MinInterval is the shortest repeat interval (CHIME_MIN_INTERVAL);
	// zero allows any positive one.
	MinInterval time.Duration
}

// ErrIntervalTooShort marks the invalid_request of an interval below
// TimerLimits.MinInterval (errors.Is), so that it can be counted as a
// quota refusal apart from the other invalid requests.
var ErrIntervalTooShort = errors.New("subjects: interval below the minimum")

// DecodeCreateTimer decodes a timer.create body and validates it
// against l.
func DecodeCreateTimer(data []byte, l TimerLimits) (TimerSpec, error) {
	var r CreateTimerRequest
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return TimerSpec{}, err
	}
	return r.Validate(l)
}

// Validate checks the request against l and returns its spec.
func (r *CreateTimerRequest) Validate(l TimerLimits) (TimerSpec, error) {
	var spec TimerSpec
	var err error
	if r.Cron != "" {
		if spec.Calendar, err = r.calendar(l); err != nil {
			return TimerSpec{}, err
		}
	} else if err := r.noCalendar(); err != nil {
		return TimerSpec{}, err
	} else {
		d, err := subjects.PositiveInt("duration_ms", r.DurationMs, MaxTimerMs)
		if err != nil {
			return TimerSpec{}, err
		}
		spec.Duration = time.Duration(d) * time.Millisecond
	}
	spec.Summary, spec.AuthorityClass = r.Summary, r.AuthorityClass
	if !subjects.IsNull(r.IntervalMs) {
		i, err := subjects.PositiveInt("interval_ms", r.IntervalMs, MaxTimerMs)
		if err != nil {
			return TimerSpec{}, err
		}
		spec.Interval = time.Duration(i) * time.Millisecond
		if spec.Interval < l.MinInterval {
			wire := &subjects.Error{Code: subjects.CodeInvalidRequest, Message: fmt.Sprintf("interval_ms must be at least %d", l.MinInterval.Milliseconds())}
			return TimerSpec{}, fmt.Errorf("%w (%w)", wire, ErrIntervalTooShort)
		}
	}
	if n := utf8.RuneCountInString(r.Summary); n > MaxSummaryLen {
		return TimerSpec{}, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: fmt.Sprintf("summary must be at most %d characters", MaxSummaryLen)}
	}
	if len(r.AuthorityClass) > subjects.MaxIDLen {
		return TimerSpec{}, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: fmt.Sprintf("authority_class must be at most %d characters", subjects.MaxIDLen)}
	}
	if r.RequestID != nil {
		if err := subjects.ValidateRequestID(*r.RequestID); err != nil {
			return TimerSpec{}, err
		}
	}
	spec.Request, err = subjects.NewRequestKey(r.RequestID, subjects.ActionTimerCreate, timerRequest{
		DurationMs: spec.Duration.Milliseconds(), IntervalMs: spec.Interval.Milliseconds(), Summary: spec.Summary, AuthorityClass: spec.AuthorityClass,
		CalendarSpec: spec.Calendar,
	})
	if err != nil {
		return TimerSpec{}, err
	}
	return spec, nil
}

// ListTimersRequest is the body of agent.<id>.timer.list: a listing's.
type ListTimersRequest = subjects.ListRequest

// DecodeListTimers decodes a timer.list body: its limit and cursor.
func DecodeListTimers(data []byte) (subjects.ListPage, error) {
	return subjects.DecodeListPage(subjects.ActionTimerList, 1, data)
}

// ListTimersReply is a page of a timer listing, in the order of each
// timer's last change, oldest first; NextCursor is where the next page
// starts, "" after the last.
type ListTimersReply struct {
	Timers     []Timer `json:"timers"`
	NextCursor string  `json:"next_cursor"`
}

// TimerRef names one timer: the body of timer.get and timer.cancel.
type TimerRef struct {
	TimerID string `json:"timer_id"`
}

// Validate checks the timer ID.
func (r *TimerRef) Validate() error { return subjects.ValidateID("timer_id", r.TimerID) }

// DecodeTimerRef decodes a timer.get or timer.cancel body and returns the
// timer ID.
func DecodeTimerRef(data []byte) (string, error) {
	var r TimerRef
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return "", err
	}
	return r.TimerID, r.Validate()
}

// ErrNotFound is the timer_not_found error for a timer ID.
func ErrNotFound(timerID string) *subjects.Error {
	return &subjects.Error{Code: subjects.CodeTimerNotFound, Message: "timer " + timerID + " not found"}
}

// ErrCompleted is the timer_completed error for a timer ID.
func ErrCompleted(timerID string) *subjects.Error {
	return &subjects.Error{Code: subjects.CodeTimerCompleted, Message: "cannot cancel completed timer " + timerID}
}

// TimerFired is the timer.fire event: one occurrence of a timer, published
// by the replica that owns the timer's shard with Nats-Msg-Id FireMsgID.
type TimerFired struct {
	AgentID    string    `json:"agent_id"`
	TimerID    string    `json:"timer_id"`
	Occurrence int64     `json:"occurrence"`
	DueAt      time.Time `json:"due_at"`
	FiredAt    time.Time `json:"fired_at"`
	Text       string    `json:"text"`
	// NextDue is, for a repeating timer, the due time of the next
	// occurrence as the scheduler chose it when it fired this one (an
	// overdue timer skips to its cadence's next point after the fire):
	// the record must say the same, or a replica taking over would
	// number occurrences differently.
	NextDue *time.Time `json:"next_due,omitempty"`
	// Calendar marks a calendar timer's occurrence: its identity is its
	// scheduled time (DueAt), and NextDue nil means it was the last.
	Calendar bool `json:"calendar,omitempty"`
	// Skipped marks a calendar occurrence that was missed and not fired
	// (its catch-up policy): the record moves on without a fire.
	Skipped bool `json:"skipped,omitempty"`
}

// MsgID is the stable JetStream message ID of this occurrence: two owners
// overlapping for a moment publish the same ID and the stream keeps one.
func (f *TimerFired) MsgID() string {
	return fmt.Sprintf("%s.%s:%d", f.AgentID, f.TimerID, f.Occurrence)
}

// EnvelopeID is the stable ID of the inbox delivery of this occurrence.
func (f *TimerFired) EnvelopeID() string {
	if f.Calendar {
		// One per scheduled time, whoever numbers it: catch-up policies
		// may skip occurrences without numbers, never times.
		return "timer_" + f.TimerID + "_at_" + f.DueAt.UTC().Format(envelopeTime)
	}
	return "timer_" + f.TimerID + "_" + strconv.FormatInt(f.Occurrence, 10)
}

// envelopeTime writes a calendar occurrence's scheduled time in its
// envelope ID (cron has whole seconds).
const envelopeTime = "20060102T150405Z"

// TimerFiredData is the data of a timer_fired delivery.
type TimerFiredData struct {
	TimerID    string    `json:"timer_id"`
	Occurrence int64     `json:"occurrence"`
	DueAt      time.Time `json:"due_at"`
	FiredAt    time.Time `json:"fired_at"`
	// NextDueAt is, for a repeating timer, the due time of its next
	// occurrence as chosen when this one fired: the cadence ticks after
	// due_at and before next_due_at fell due while this occurrence could
	// not fire, and it is their one catch-up fire (absent from one-shots,
	// and from envelopes of earlier versions).
	NextDueAt *time.Time `json:"next_due_at,omitempty"`
	// ScheduledAt is a calendar timer's scheduled time (due_at too; the
	// fire may be later by its jitter or a catch-up).
	ScheduledAt *time.Time `json:"scheduled_at,omitempty"`
}

// TimerFiredEnvelope builds the inbox delivery of a fire event.
func TimerFiredEnvelope(f *TimerFired) subjects.Envelope {
	d := TimerFiredData{TimerID: f.TimerID, Occurrence: f.Occurrence, DueAt: f.DueAt, FiredAt: f.FiredAt, NextDueAt: f.NextDue}
	if f.Calendar {
		d.ScheduledAt = &f.DueAt
	}
	data, _ := json.Marshal(d)
	return subjects.Envelope{
		ID:      f.EnvelopeID(),
		AgentID: f.AgentID,
		Kind:    subjects.KindTimerFired,
		At:      f.FiredAt,
		Source:  subjects.Source{Type: "timer", ID: f.TimerID},
		Trust:   subjects.TrustSystem,
		Text:    f.Text,
		Data:    data,
	}
}

// TimerFiredMsg is the inbox message of a timer fire, byte for byte what
// TimerFiredEnvelope(f).Msg() gives, encoded without reflection: a burst
// of fires spends its time here otherwise.
func TimerFiredMsg(f *TimerFired) *nats.Msg {
	b := make([]byte, 0, 320+len(f.Text))
	id := f.EnvelopeID()
	b = append(b, `{"id":`...)
	b = subjects.AppendJSONString(b, id)
	b = append(b, `,"agent_id":`...)
	b = subjects.AppendJSONString(b, f.AgentID)
	b = append(b, `,"kind":"`+subjects.KindTimerFired+`","at":`...)
	b = subjects.AppendJSONTime(b, f.FiredAt)
	b = append(b, `,"source":{"type":"timer","id":`...)
	b = subjects.AppendJSONString(b, f.TimerID)
	b = append(b, `},"trust":"`+subjects.TrustSystem+`"`...)
	if f.Text != "" {
		b = append(b, `,"text":`...)
		b = subjects.AppendJSONString(b, f.Text)
	}
	b = append(b, `,"data":{"timer_id":`...)
	b = subjects.AppendJSONString(b, f.TimerID)
	b = append(b, `,"occurrence":`...)
	b = strconv.AppendInt(b, f.Occurrence, 10)
	b = append(b, `,"due_at":`...)
	b = subjects.AppendJSONTime(b, f.DueAt)
	b = append(b, `,"fired_at":`...)
	b = subjects.AppendJSONTime(b, f.FiredAt)
	if f.NextDue != nil {
		b = append(b, `,"next_due_at":`...)
		b = subjects.AppendJSONTime(b, *f.NextDue)
	}
	if f.Calendar {
		b = append(b, `,"scheduled_at":`...)
		b = subjects.AppendJSONTime(b, f.DueAt)
	}
	b = append(b, "}}"...)
	m := &nats.Msg{Subject: subjects.Inbox(f.AgentID), Data: b, Header: nats.Header{
		subjects.HeaderKind: {subjects.KindTimerFired}, subjects.HeaderMsgID: {id},
	}}
	return m
}
