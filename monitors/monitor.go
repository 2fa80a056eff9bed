// Package monitors owns monitors: standing watches that deliver what a
// source produces to an agent's inbox as monitor_event envelopes until the
// monitor stops (a timeout, an idle timeout, a stop, the source's end, a
// flood, its event limit), which a monitor_stopped envelope says.
//
// Records live in the monitors bucket, key <agent>.<monitor_id>; every
// change is a CAS. The command source is an executor outside chime
// (`chime monitor run -- CMD`) that sends the command's lines with
// monitor.emit; the NATS subject and KV sources are watched inside chime,
// on the replica holding the monitor's shard (Watcher), a KV watch
// resuming from the revision its record counted. Either way chime filters
// the lines (match, exclude), caps them, paces them with the record's
// token bucket, and delivers each batch under a stable envelope ID, so a
// retried batch is stored once. Every replica sweeps for timeouts
// (Sweeper).
package monitors

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nuid"

	"github.com/chime-nats/chime/subjects"
)

// Monitor actions: agent.<id>.monitor.<action>.
const (
	ActionStart = "monitor.start"
	ActionStop  = "monitor.stop"
	ActionGet   = "monitor.get"
	ActionList  = "monitor.list"
)

// Monitor error codes.
const (
	CodeMonitorNotFound = "monitor_not_found"
	// CodeSourceNotServed refuses a source the design names and chime
	// does not serve yet.
	CodeSourceNotServed = "monitor_source_not_served"
	// CodeMonitorStopped refuses events for a monitor that has stopped.
	CodeMonitorStopped = "monitor_stopped"
)

// Sentinels for errors.Is.
var (
	ErrMonitorNotFound = &subjects.Error{Code: CodeMonitorNotFound}
	ErrMonitorStopped  = &subjects.Error{Code: CodeMonitorStopped}
)

// MonitorNotFound is the error of an unknown monitor of the agent's.
func MonitorNotFound(id string) *subjects.Error {
	return &subjects.Error{Code: CodeMonitorNotFound, Message: fmt.Sprintf("monitor %s not found", id), Status: 404}
}

// Limits of a monitor's request.
const (
	MaxDescriptionLen = 200
	MaxPatternLen     = 1024
	MaxCommandLen     = 4096
	// MaxSourceLen bounds the other sources' values (a subject, a KV
	// key, a URL); each source's checker may bound them further.
	MaxSourceLen   = 2048
	DefaultTimeout = 5 * time.Minute
	MaxTimeout     = time.Hour
	MaxIdleTimeout = 24 * time.Hour
	MaxMaxEvents   = 1_000_000
	// An http source is polled every interval_ms: DefaultInterval
	// unless set, never faster than MinInterval.
	DefaultInterval = time.Minute
	MinInterval     = 30 * time.Second
	MaxInterval     = 24 * time.Hour
)

// Status is where a monitor is.
type Status string

// Monitor statuses.
const (
	Running Status = "running"
	Stopped Status = "stopped"
)

// Why a monitor stopped.
const (
	ReasonTimeout     = "timeout"
	ReasonIdleTimeout = "idle_timeout"
	ReasonStopped     = "stopped"
	ReasonSourceEnded = "source_ended"
	ReasonFlood       = "flood"
	ReasonMaxEvents   = "max_events"
)

// Source types.
const (
	SourceCommand = "command"
	SourceSubject = "subject"
	SourceKV      = "kv"
	SourceWS      = "ws"
	SourceHTTP    = "http"
)

// Source is what a monitor watches: Type and the value of its field (the
// command line an executor runs, a subject...).
type Source struct {
	Type  string `json:"type"`
	Value string `json:"value"`
}

// Bucket is a monitor's token bucket, kept in its record so that any
// replica paces it alike: Tokens at At.
type Bucket struct {
	Tokens float64   `json:"tokens"`
	At     time.Time `json:"at"`
}

// Monitor is the record of a monitor, key <agent>.<monitor_id> of the
// monitors bucket.
type Monitor struct {
	ID            string     `json:"monitor_id"`
	AgentID       string     `json:"agent_id"`
	Description   string     `json:"description"`
	Source        Source     `json:"source"`
	Match         string     `json:"match,omitempty"`
	Exclude       string     `json:"exclude,omitempty"`
	TimeoutMS     int64      `json:"timeout_ms,omitempty"`
	Persistent    bool       `json:"persistent,omitempty"`
	MaxEvents     int64      `json:"max_events,omitempty"`
	IdleTimeoutMS int64      `json:"idle_timeout_ms,omitempty"`
	IntervalMS    int64      `json:"interval_ms,omitempty"` // an http source's poll interval
	Status        Status     `json:"status"`
	CreatedAt     time.Time  `json:"created_at"`
	ExpiresAt     *time.Time `json:"expires_at,omitempty"`
	StoppedAt     *time.Time `json:"stopped_at,omitempty"`
	StopReason    string     `json:"stop_reason,omitempty"`
	ExitCode      *int       `json:"exit_code,omitempty"`
	// Events counts the lines delivered, Batches the monitor_event
	// envelopes, Filtered the lines match or exclude dropped, Suppressed
	// those the token bucket dropped.
	Events     int64 `json:"events"`
	Batches    int64 `json:"batches"`
	Filtered   int64 `json:"filtered,omitempty"`
	Suppressed int64 `json:"suppressed,omitempty"`
	// PendingSuppressed counts the lines dropped since the last batch
	// delivered: the next one says so in one line.
	PendingSuppressed int64 `json:"pending_suppressed,omitempty"`
	// NextSeq is the seq of the next batch a source sends.
	NextSeq int64 `json:"next_seq"`
	// Cursor is where an in-chime source that keeps one (a KV watch's
	// revision) stood after the last batch counted: a moved monitor
	// resumes from it.
	Cursor      string     `json:"cursor,omitempty"`
	LastEventAt *time.Time `json:"last_event_at,omitempty"`
	Bucket      *Bucket    `json:"bucket,omitempty"`
	// FloodSince is when the batches began losing lines to the bucket
	// without a batch between that lost none.
	FloodSince *time.Time `json:"flood_since,omitempty"`
	// DeliveredAt is set once the monitor_stopped envelope is stored.
	DeliveredAt *time.Time `json:"delivered_at,omitempty"`
}

// Finished reports whether the monitor has stopped.
func (m *Monitor) Finished() bool { return m.Status == Stopped }

// IdleDeadline is when the monitor stops for want of events (zero: never).
func (m *Monitor) IdleDeadline() time.Time {
	if m.IdleTimeoutMS <= 0 {
		return time.Time{}
	}
	since := m.CreatedAt
	if m.LastEventAt != nil {
		since = *m.LastEventAt
	}
	return since.Add(time.Duration(m.IdleTimeoutMS) * time.Millisecond)
}

// Key is the KV key of a monitor record.
func Key(agentID, id string) string { return agentID + "." + id }

// NewID returns a fresh monitor ID.
func NewID() string { return "mon_" + nuid.Next() }

// StartRequest is the body of monitor.start: a description, one source,
// and the monitor's bounds.
type StartRequest struct {
	MonitorID     string          `json:"monitor_id,omitempty"`
	Description   string          `json:"description"`
	Command       string          `json:"command,omitempty"`
	Subject       string          `json:"subject,omitempty"`
	KV            string          `json:"kv,omitempty"`
	WS            string          `json:"ws,omitempty"`
	HTTP          string          `json:"http,omitempty"`
	Match         string          `json:"match,omitempty"`
	Exclude       string          `json:"exclude,omitempty"`
	TimeoutMS     json.RawMessage `json:"timeout_ms,omitempty"`
	Persistent    bool            `json:"persistent,omitempty"`
	MaxEvents     json.RawMessage `json:"max_events,omitempty"`
	IdleTimeoutMS json.RawMessage `json:"idle_timeout_ms,omitempty"`
	// IntervalMS is how often an http source is polled (http only).
	IntervalMS json.RawMessage `json:"interval_ms,omitempty"`
}

// Spec is a validated monitor.start.
type Spec struct {
	MonitorID     string
	Description   string
	Source        Source
	Match         string
	Exclude       string
	Timeout       time.Duration // 0 with Persistent
	Persistent    bool
	MaxEvents     int64
	IdleTimeout   time.Duration
	Interval      time.Duration // an http source's poll interval; 0 for others
	match, ignore *regexp.Regexp
}

// DecodeStart decodes and checks a monitor.start body.
func DecodeStart(data []byte) (*Spec, error) {
	var r StartRequest
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return nil, err
	}
	return r.Spec()
}

// Spec checks the request, in the order the contract lists.
func (r *StartRequest) Spec() (*Spec, error) {
	s := &Spec{MonitorID: r.MonitorID, Description: r.Description, Match: r.Match, Exclude: r.Exclude, Persistent: r.Persistent}
	if r.MonitorID != "" {
		if err := subjects.ValidateID("monitor_id", r.MonitorID); err != nil {
			return nil, err
		}
	}
	if err := checkDescription(r.Description); err != nil {
		return nil, err
	}
	src, err := r.source()
	if err != nil {
		return nil, err
	}
	s.Source = src
	if s.Interval, err = interval(src, r.IntervalMS); err != nil {
		return nil, err
	}
	if s.match, err = pattern("match", r.Match); err != nil {
		return nil, err
	}
	if s.ignore, err = pattern("exclude", r.Exclude); err != nil {
		return nil, err
	}
	switch {
	case r.Persistent && !subjects.IsNull(r.TimeoutMS):
		return nil, subjects.Invalid("timeout_ms and persistent are exclusive: a persistent monitor runs until stopped")
	case r.Persistent:
	case subjects.IsNull(r.TimeoutMS):
		s.Timeout = DefaultTimeout
	default:
		n, err := subjects.PositiveInt("timeout_ms", r.TimeoutMS, MaxTimeout.Milliseconds())
		if err != nil {
			return nil, err
		}
		s.Timeout = time.Duration(n) * time.Millisecond
	}
	if !subjects.IsNull(r.MaxEvents) {
		if s.MaxEvents, err = subjects.PositiveInt("max_events", r.MaxEvents, MaxMaxEvents); err != nil {
			return nil, err
		}
	}
	if !subjects.IsNull(r.IdleTimeoutMS) {
		n, err := subjects.PositiveInt("idle_timeout_ms", r.IdleTimeoutMS, MaxIdleTimeout.Milliseconds())
		if err != nil {
			return nil, err
		}
		s.IdleTimeout = time.Duration(n) * time.Millisecond
	}
	return s, nil
}

func checkDescription(d string) error {
	switch {
	case strings.TrimSpace(d) == "":
		return subjects.Invalid("description is required: it names the monitor in every event")
	case utf8.RuneCountInString(d) > MaxDescriptionLen:
		return subjects.Invalid(fmt.Sprintf("description must be at most %d characters", MaxDescriptionLen))
	case strings.ContainsAny(d, "\r\n"):
		return subjects.Invalid("description must be one line")
	}
	return nil
}

// source picks the request's one source.
func (r *StartRequest) source() (Source, error) {
	var set []Source
	for _, s := range []Source{{SourceCommand, r.Command}, {SourceSubject, r.Subject}, {SourceKV, r.KV}, {SourceWS, r.WS}, {SourceHTTP, r.HTTP}} {
		if s.Value != "" {
			set = append(set, s)
		}
	}
	switch {
	case len(set) == 0:
		return Source{}, subjects.Invalid("a source is required: one of command, subject, kv, ws, http")
	case len(set) > 1:
		return Source{}, subjects.Invalid(fmt.Sprintf("one source only, not %s and %s", set[0].Type, set[1].Type))
	}
	s := set[0]
	switch {
	case s.Type == SourceCommand && len(s.Value) > MaxCommandLen:
		return Source{}, subjects.Invalid(fmt.Sprintf("command must be at most %d bytes", MaxCommandLen))
	case len(s.Value) > MaxSourceLen:
		return Source{}, subjects.Invalid(fmt.Sprintf("%s must be at most %d bytes", s.Type, MaxSourceLen))
	case strings.ContainsAny(s.Value, "\r\n"):
		return Source{}, subjects.Invalid(s.Type + " must be one line")
	}
	// Whether this replica serves the type, and whether the agent may
	// watch the value, is the store's to say (Store.served).
	return s, nil
}

// interval is an http source's poll interval: DefaultInterval when
// unset, within MinInterval and MaxInterval, so that no agent makes chime
// hammer a URL; the field means nothing to another source.
func interval(src Source, raw json.RawMessage) (time.Duration, error) {
	set := !subjects.IsNull(raw)
	switch {
	case src.Type != SourceHTTP && set:
		return 0, subjects.Invalid(fmt.Sprintf("interval_ms is for an http source only (how often its URL is polled), not a %s", src.Type))
	case src.Type != SourceHTTP:
		return 0, nil
	case !set:
		return DefaultInterval, nil
	}
	n, err := subjects.PositiveInt("interval_ms", raw, MaxInterval.Milliseconds())
	if err != nil {
		return 0, err
	}
	if d := time.Duration(n) * time.Millisecond; d >= MinInterval {
		return d, nil
	}
	return 0, subjects.Invalid(fmt.Sprintf("interval_ms must be at least %d (30 s): a URL is polled no faster, not %d", MinInterval.Milliseconds(), n))
}

// pattern compiles a match or exclude expression (Go's RE2 syntax).
func pattern(field, expr string) (*regexp.Regexp, error) {
	if expr == "" {
		return nil, nil
	}
	if len(expr) > MaxPatternLen {
		return nil, subjects.Invalid(fmt.Sprintf("%s must be at most %d bytes", field, MaxPatternLen))
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return nil, subjects.Invalid(fmt.Sprintf("%s is not a valid regular expression: %v", field, err))
	}
	return re, nil
}

// Ref names one monitor: the body of monitor.get.
type Ref struct {
	MonitorID string `json:"monitor_id"`
}

// Validate checks the monitor ID.
func (r *Ref) Validate() error { return subjects.ValidateID("monitor_id", r.MonitorID) }

// DecodeRef decodes a monitor.get body.
func DecodeRef(data []byte) (string, error) {
	var r Ref
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return "", err
	}
	return r.MonitorID, r.Validate()
}

// StopRequest is the body of monitor.stop. ExitCode is the source's end,
// reported by its executor: the reason is then source_ended.
type StopRequest struct {
	MonitorID string `json:"monitor_id"`
	ExitCode  *int   `json:"exit_code,omitempty"`
}

// Validate checks a stop.
func (r *StopRequest) Validate() error { return subjects.ValidateID("monitor_id", r.MonitorID) }

// DecodeStop decodes a monitor.stop body.
func DecodeStop(data []byte) (*StopRequest, error) {
	var r StopRequest
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return nil, err
	}
	return &r, r.Validate()
}

// ListRequest is the body of monitor.list.
type ListRequest = subjects.ListRequest

// DecodeList decodes a monitor.list body.
func DecodeList(data []byte) (subjects.ListPage, error) {
	return subjects.DecodeListPage(ActionList, 1, data)
}

// ListReply is a page of a monitor listing, in the order of each
// monitor's last change, oldest first.
type ListReply struct {
	Monitors   []Monitor `json:"monitors"`
	NextCursor string    `json:"next_cursor"`
}

// StoppedEnvelopeID is the stable envelope ID of a monitor's end.
func StoppedEnvelopeID(id string) string { return "monitor_" + id + "_stopped" }

// StoppedData is the data of a monitor_stopped delivery.
type StoppedData struct {
	MonitorID   string `json:"monitor_id"`
	Description string `json:"description"`
	Reason      string `json:"reason"`
	ExitCode    *int   `json:"exit_code,omitempty"`
	Events      int64  `json:"events"`
	Suppressed  int64  `json:"suppressed,omitempty"`
}

// StoppedText is the text of a monitor_stopped delivery.
func StoppedText(m *Monitor) string {
	why := m.StopReason
	switch m.StopReason {
	case ReasonTimeout:
		why = "its timeout passed"
	case ReasonIdleTimeout:
		why = "no event came within its idle timeout"
	case ReasonStopped:
		why = "it was stopped"
	case ReasonSourceEnded:
		why = "its source ended"
		if m.ExitCode != nil {
			why = fmt.Sprintf("its source ended with exit code %d", *m.ExitCode)
		}
	case ReasonFlood:
		why = "it flooded for 30 s"
	case ReasonMaxEvents:
		why = fmt.Sprintf("it delivered its max_events (%d)", m.MaxEvents)
	}
	return fmt.Sprintf("Monitor %s (%s) stopped: %s; %d events delivered.", m.ID, m.Description, why, m.Events)
}

// StoppedEnvelope builds a stopped monitor's one monitor_stopped delivery:
// chime's own record (system), the description quoted as the agent gave it.
func StoppedEnvelope(m *Monitor) subjects.Envelope {
	data, _ := subjects.EncodeJSON(StoppedData{
		MonitorID: m.ID, Description: m.Description, Reason: m.StopReason, ExitCode: m.ExitCode,
		Events: m.Events, Suppressed: m.Suppressed,
	})
	at := m.CreatedAt
	if m.StoppedAt != nil {
		at = *m.StoppedAt
	}
	return subjects.Envelope{
		ID: StoppedEnvelopeID(m.ID), AgentID: m.AgentID, Kind: subjects.KindMonitorStopped, At: at,
		Source: subjects.Source{Type: "monitor", ID: m.ID}, Trust: subjects.TrustSystem, Text: StoppedText(m), Data: data,
	}
}

// Pace is how fast a monitor's events reach the inbox: a token bucket of
// Burst lines refilled at Rate lines a second.
type Pace struct {
	Rate  float64
	Burst int
}

// DefaultPace lets a burst of 100 lines through, then 10 a second.
func DefaultPace() Pace { return Pace{Rate: 10, Burst: 100} }
