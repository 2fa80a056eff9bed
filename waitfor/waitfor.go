package waitfor

import (
	"encoding/json"
	"fmt"
	"github.com/chime-nats/chime/subjects"
	"slices"
	"strings"
	"time"
	"unicode"
)

// ActionWaitFor is the agent's request to yield until a named wake.
const ActionWaitFor = "wait.for"

// WakeKind is what ends a WaitFor.
type WakeKind string

// Wake kinds.
const (
	WakeOperatorInput WakeKind = "operator_input"
	WakeTaskResult    WakeKind = "task_result"
	WakeExternal      WakeKind = "external"
	WakeTimer         WakeKind = "timer"
	WakeSystem        WakeKind = "system"
	// WakeMonitor waits on a monitor's next monitor_event, or its end
	// (monitor_stopped): chime's own, Holon has no monitors.
	WakeMonitor WakeKind = "monitor"
)

// WakeKinds lists every accepted wake, in the order prompts show them.
func WakeKinds() []WakeKind {
	return []WakeKind{WakeOperatorInput, WakeTaskResult, WakeExternal, WakeTimer, WakeSystem, WakeMonitor}
}

// NeedsResource says whether a wake names the thing it waits on.
func (w WakeKind) NeedsResource() bool {
	return w == WakeTaskResult || w == WakeTimer || w == WakeMonitor
}

// Delivery is how a WaitFor's wake reaches the agent.
type Delivery string

// Deliveries.
const (
	DeliveryFinal  Delivery = "final"
	DeliverySilent Delivery = "silent"
)

// Deliveries lists every accepted delivery.
func Deliveries() []Delivery { return []Delivery{DeliveryFinal, DeliverySilent} }

// Continuation tells the agent what to do after a WaitFor reply.
type Continuation string

// Continuations.
const (
	ContinueTurn    Continuation = "continue_turn"
	YieldAndWait    Continuation = "yield_and_wait"
	YieldAndReenter Continuation = "yield_and_reenter"
)

// maxRecheckMs bounds recheck_after_ms at 30 days.
const maxRecheckMs = 30 * 24 * 3600 * 1000

// WaitForRequest is the body of agent.<id>.wait.for.
type WaitForRequest struct {
	Wake           string          `json:"wake"`
	Resource       string          `json:"resource,omitempty"`
	Reason         string          `json:"reason"`
	Delivery       string          `json:"delivery"`
	WorkItemID     string          `json:"work_item_id,omitempty"`
	RecheckAfterMs json.RawMessage `json:"recheck_after_ms,omitempty"`
}

// WaitForSpec is a validated WaitFor request. Whether the resource exists
// and belongs to the agent is the store's question, not the decoder's.
type WaitForSpec struct {
	Wake         WakeKind
	Resource     string
	Reason       string
	Delivery     Delivery
	WorkItemID   string
	RecheckAfter time.Duration // zero: no recheck
	// Resources and Mode make a task_result wait one over a set of tasks
	// (wait.tasks); Resource is then empty.
	Resources []string
	Mode      string
}

// MaxExternalResourceLen bounds an external wake's free-form resource.
const MaxExternalResourceLen = 256

// DecodeWaitFor validates a WaitFor request with Holon's rules: a blank
// resource counts as absent, and task_result, timer and monitor need one;
// an external resource is free-form (github:holon-run/holon#2258).
func DecodeWaitFor(data []byte) (*WaitForSpec, error) {
	var req WaitForRequest
	if err := subjects.DecodeStrict(data, &req); err != nil {
		return nil, err
	}
	spec := &WaitForSpec{Wake: WakeKind(req.Wake), Resource: strings.TrimSpace(req.Resource), Reason: strings.TrimSpace(req.Reason),
		Delivery: Delivery(req.Delivery), WorkItemID: req.WorkItemID}
	switch {
	case req.Wake == "":
		return nil, subjects.Invalid("wake is required")
	case !slices.Contains(WakeKinds(), spec.Wake):
		return nil, subjects.Invalid("wake must be one of " + joinValues(WakeKinds()) + ", not " + req.Wake)
	case spec.Reason == "":
		return nil, subjects.Invalid("WaitFor requires a non-empty `reason`") // Holon's text
	case req.Delivery == "":
		return nil, subjects.Invalid("delivery is required")
	case !slices.Contains(Deliveries(), spec.Delivery):
		return nil, subjects.Invalid("delivery must be one of " + joinValues(Deliveries()) + ", not " + req.Delivery)
	case spec.Wake.NeedsResource() && spec.Resource == "":
		return nil, subjects.Invalid("WaitFor wake `" + req.Wake + "` requires non-empty `resource`")
	}
	switch {
	case spec.Wake.NeedsResource():
		// A task, timer or monitor ID: it names a record key.
		if err := subjects.ValidateID("resource", spec.Resource); err != nil {
			return nil, err
		}
	case len(spec.Resource) > MaxExternalResourceLen:
		return nil, subjects.Invalid(fmt.Sprintf("resource must be at most %d bytes", MaxExternalResourceLen))
	case strings.ContainsFunc(spec.Resource, unicode.IsControl):
		return nil, subjects.Invalid("resource must not contain control characters")
	}
	if req.WorkItemID != "" {
		if err := subjects.ValidateID("work_item_id", req.WorkItemID); err != nil {
			return nil, err
		}
	}
	if !subjects.IsNull(req.RecheckAfterMs) {
		ms, err := subjects.PositiveInt("recheck_after_ms", req.RecheckAfterMs, maxRecheckMs)
		if err != nil {
			return nil, err
		}
		spec.RecheckAfter = time.Duration(ms) * time.Millisecond
	}
	return spec, nil
}

// ActionWaitTasks is the agent's request to yield until all or any of a
// set of tasks has its result (the Responses API pattern).
const ActionWaitTasks = "wait.tasks"

// Modes of a wait over a set of tasks.
const (
	WaitModeAll = "all"
	WaitModeAny = "any"
)

// MaxWaitTasks bounds the set of one wait.tasks.
const MaxWaitTasks = 100

// WaitTasksRequest is the body of agent.<id>.wait.tasks.
type WaitTasksRequest struct {
	TaskIDs    []string `json:"task_ids"`
	Mode       string   `json:"mode"`
	Reason     string   `json:"reason"`
	Delivery   string   `json:"delivery,omitempty"`
	WorkItemID string   `json:"work_item_id,omitempty"`
}

// DecodeWaitTasks validates a wait.tasks request into a task_result
// WaitFor over the set; delivery defaults to silent.
func DecodeWaitTasks(data []byte) (*WaitForSpec, error) {
	var req WaitTasksRequest
	if err := subjects.DecodeStrict(data, &req); err != nil {
		return nil, err
	}
	spec := &WaitForSpec{Wake: WakeTaskResult, Reason: strings.TrimSpace(req.Reason), Delivery: Delivery(req.Delivery),
		WorkItemID: req.WorkItemID, Mode: req.Mode}
	if spec.Delivery == "" {
		spec.Delivery = DeliverySilent
	}
	switch {
	case len(req.TaskIDs) == 0:
		return nil, subjects.Invalid("task_ids must not be empty")
	case len(req.TaskIDs) > MaxWaitTasks:
		return nil, subjects.Invalid(fmt.Sprintf("task_ids must be at most %d", MaxWaitTasks))
	case req.Mode != WaitModeAll && req.Mode != WaitModeAny:
		return nil, subjects.Invalid("mode must be all or any")
	case spec.Reason == "":
		return nil, subjects.Invalid("reason is required")
	case !slices.Contains(Deliveries(), spec.Delivery):
		return nil, subjects.Invalid("delivery must be one of " + joinValues(Deliveries()) + ", not " + req.Delivery)
	}
	for i, id := range req.TaskIDs {
		if err := subjects.ValidateID("task_id", id); err != nil {
			return nil, err
		}
		if slices.Contains(req.TaskIDs[:i], id) {
			return nil, subjects.Invalid("task_ids must not repeat " + id)
		}
	}
	spec.Resources = req.TaskIDs
	if req.WorkItemID != "" {
		if err := subjects.ValidateID("work_item_id", req.WorkItemID); err != nil {
			return nil, err
		}
	}
	return spec, nil
}

func joinValues[T ~string](vs []T) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = string(v)
	}
	return strings.Join(s, ", ")
}

// Further WaitFor actions: the final report that commits a delivery=final
// WaitFor, and the operators' system wake.
const (
	ActionWaitReport = "wait.report"
	ActionSystemWake = "system.wake"
)

// Dispositions of a WaitFor reply (Holon's).
const (
	DispositionAwaitingFinalReport       = "awaiting_final_report"
	DispositionRegistered                = "registered"
	DispositionTaskResultQueued          = "task_result_queued"
	DispositionTaskResultAlreadyConsumed = "task_result_already_consumed"
)

// WaitFor error codes; the texts of the resource checks are Holon's.
const (
	CodeWaitForNotFound    = "wait_for_not_found"
	CodeWaitForTimer       = "wait_for_timer"
	CodeWaitForTask        = "wait_for_task"
	CodeWaitForInvalidated = "wait_for_invalidated"
)

// The codes of a monitor resource's checks: the monitors package's own
// (monitors.CodeMonitorNotFound, CodeMonitorStopped), spelt out here as
// this package must not link that one (see MonitorLookup).
const (
	CodeMonitorNotFound = "monitor_not_found"
	CodeMonitorStopped  = "monitor_stopped"
)

// Sentinels of the WaitFor errors, for errors.Is.
var (
	ErrWaitForNotFound    = &subjects.Error{Code: CodeWaitForNotFound}
	ErrWaitForTimer       = &subjects.Error{Code: CodeWaitForTimer}
	ErrWaitForTask        = &subjects.Error{Code: CodeWaitForTask}
	ErrWaitForInvalidated = &subjects.Error{Code: CodeWaitForInvalidated}
)

// WaitForStatus is where a WaitFor registration is in its life.
type WaitForStatus string

// Statuses. prepared (delivery=final, no report yet) and active are live;
// the rest are final.
const (
	WaitForPrepared  WaitForStatus = "prepared"
	WaitForActive    WaitForStatus = "active"
	WaitForWoken     WaitForStatus = "woken"
	WaitForCancelled WaitForStatus = "cancelled"
	// WaitForInvalidated is a prepared WaitFor whose report can no longer
	// commit: an operator message came first.
	WaitForInvalidated WaitForStatus = "invalidated"
)

// End reasons.
const (
	EndWaitForReplaced = "wait_for_replaced" // Holon's reason: a newer WaitFor in the same scope
	EndAgentStopped    = "agent_stopped"     // an intervention stop
	EndOperatorMessage = "operator_message"  // an operator message before the report
)

// Scopes of a WaitFor (Holon's): a work item, or the agent.
const (
	ScopeAgent    = "agent"
	ScopeWorkItem = "work_item"
)

// WakeCause is what woke a WaitFor.
type WakeCause struct {
	Kind       string          `json:"kind"`        // the envelope kind
	EnvelopeID string          `json:"envelope_id"` // the envelope that woke it
	Source     subjects.Source `json:"source"`
}

// WaitFor is a WaitFor registration, in the chime_waitfor bucket under
// rec.<agent>.<wait_id>.
type WaitFor struct {
	ID             string        `json:"wait_id"`
	AgentID        string        `json:"agent_id"`
	Wake           WakeKind      `json:"wake"`
	Resource       string        `json:"resource,omitempty"`
	Reason         string        `json:"reason"`
	Delivery       Delivery      `json:"delivery"`
	WorkItemID     string        `json:"work_item_id,omitempty"`
	Scope          string        `json:"scope"`
	RecheckAfterMs int64         `json:"recheck_after_ms,omitempty"`
	RecheckAt      *time.Time    `json:"recheck_at,omitempty"`
	RecheckSent    bool          `json:"recheck_sent,omitempty"`
	Status         WaitForStatus `json:"status"`
	CreatedAt      time.Time     `json:"created_at"`
	UpdatedAt      time.Time     `json:"updated_at"`
	EndedAt        *time.Time    `json:"ended_at,omitempty"`
	EndReason      string        `json:"end_reason,omitempty"`
	ReplacedBy     string        `json:"replaced_by,omitempty"`
	WokenBy        *WakeCause    `json:"woken_by,omitempty"`
	// Reentered says WokenBy was queued already when it was made
	// (task_result_queued): that result re-enters the agent itself, and
	// no wait_woken is ever delivered for it.
	Reentered bool   `json:"reentered,omitempty"`
	Report    string `json:"report,omitempty"`
	// SinceSeq is the inbox stream's last sequence when it was made: only
	// envelopes stored after it wake it.
	SinceSeq uint64 `json:"since_seq"`
	// AfterFire is the awaited timer's fire count when it was made: only a
	// later fire wakes it.
	AfterFire int64 `json:"after_fire,omitempty"`
	// InterventionSeq is the events-stream sequence of the agent's last
	// intervention when it was prepared: a later operator message
	// invalidates the report.
	InterventionSeq uint64 `json:"intervention_seq,omitempty"`
	// Resources is the set of tasks of a wait.tasks (Resource is then
	// empty), Mode all or any, and Seen the members whose result is in
	// the inbox: stored after the registration, or terminal at it.
	Resources []string `json:"resources,omitempty"`
	Mode      string   `json:"mode,omitempty"`
	Seen      []string `json:"seen,omitempty"`
}

// Live reports whether the registration may still end in a wake.
func (w *WaitFor) Live() bool { return w.Status == WaitForPrepared || w.Status == WaitForActive }

// Ended reports whether the registration is final (it may expire).
func (w *WaitFor) Ended() bool { return !w.Live() }

// WaitForReply is the reply of agent.<id>.wait.for and .wait.report.
type WaitForReply struct {
	WaitID       string       `json:"wait_id,omitempty"`
	Continuation Continuation `json:"continuation"`
	Disposition  string       `json:"disposition"`
	// WaitRegistered is false while a delivery=final WaitFor awaits its report.
	WaitRegistered bool   `json:"wait_registered"`
	ExpectedOutput string `json:"expected_output,omitempty"`
	Scope          string `json:"scope,omitempty"`
	Wake           string `json:"wake,omitempty"`
	Resource       string `json:"resource,omitempty"`
	WorkItemID     string `json:"work_item_id,omitempty"`
	Reason         string `json:"reason,omitempty"`
	RecheckAfterMs int64  `json:"recheck_after_ms,omitempty"`
	RecheckAt      string `json:"recheck_at,omitempty"`
	// CancelledWaitConditionIDs are the older WaitFors of the same scope this one replaced.
	CancelledWaitConditionIDs []string `json:"cancelled_wait_condition_ids,omitempty"`
	TaskID                    string   `json:"task_id,omitempty"`
	ResultMessageID           string   `json:"result_message_id,omitempty"`
	Status                    string   `json:"status,omitempty"`
	// TaskIDs, Mode and SeenTaskIDs answer a wait.tasks.
	TaskIDs     []string `json:"task_ids,omitempty"`
	Mode        string   `json:"mode,omitempty"`
	SeenTaskIDs []string `json:"seen_task_ids,omitempty"`
}

// WaitReportRequest is the body of agent.<id>.wait.report.
type WaitReportRequest struct {
	WaitID string `json:"wait_id"`
	Text   string `json:"text"`
}

// DecodeWaitReport validates a final report.
func DecodeWaitReport(data []byte) (*WaitReportRequest, error) {
	var req WaitReportRequest
	if err := subjects.DecodeStrict(data, &req); err != nil {
		return nil, err
	}
	if err := subjects.ValidateID("wait_id", req.WaitID); err != nil {
		return nil, err
	}
	if strings.TrimSpace(req.Text) == "" {
		return nil, subjects.Invalid("text must not be empty")
	}
	return &req, nil
}

// SystemWakeRequest is the body of agent.<id>.system.wake.
type SystemWakeRequest struct {
	Text string `json:"text,omitempty"`
}

// DecodeSystemWake validates a system wake.
func DecodeSystemWake(data []byte) (*SystemWakeRequest, error) {
	var req SystemWakeRequest
	if len(data) == 0 {
		return &req, nil
	}
	if err := subjects.DecodeStrict(data, &req); err != nil {
		return nil, err
	}
	return &req, nil
}

// WaitWokenData is the data of a wait_woken delivery.
type WaitWokenData struct {
	WaitID     string    `json:"wait_id"`
	Wake       WakeKind  `json:"wake"`
	Resource   string    `json:"resource,omitempty"`
	WorkItemID string    `json:"work_item_id,omitempty"`
	WokenBy    WakeCause `json:"woken_by"`
	// TaskIDs and Mode name the set of a wait.tasks.
	TaskIDs []string `json:"task_ids,omitempty"`
	Mode    string   `json:"mode,omitempty"`
}

// WaitWokenEnvelope is the one delivery of a woken WaitFor; its ID derives
// from the registration, so replicas racing to deliver it store it once.
func WaitWokenEnvelope(w *WaitFor) subjects.Envelope {
	var cause WakeCause
	if w.WokenBy != nil {
		cause = *w.WokenBy
	}
	data, _ := json.Marshal(WaitWokenData{WaitID: w.ID, Wake: w.Wake, Resource: w.Resource, WorkItemID: w.WorkItemID, WokenBy: cause,
		TaskIDs: w.Resources, Mode: w.Mode})
	at := w.UpdatedAt
	if w.EndedAt != nil {
		at = *w.EndedAt
	}
	return subjects.Envelope{
		ID: "wait_woken_" + w.ID, AgentID: w.AgentID, Kind: subjects.KindWaitWoken, At: at.UTC(),
		Source: subjects.Source{Type: "wait_for", ID: w.ID}, Trust: subjects.TrustSystem,
		Text: fmt.Sprintf("WaitFor %s woken by %s: %s", w.ID, cause.Kind, w.Reason), Data: data,
	}
}

// RecheckEnvelope is the one recheck delivery of a WaitFor.
func RecheckEnvelope(w *WaitFor, at time.Time) subjects.Envelope {
	data, _ := json.Marshal(map[string]any{"wait_id": w.ID, "wake": w.Wake, "resource": w.Resource, "recheck_after_ms": w.RecheckAfterMs})
	return subjects.Envelope{
		ID: "recheck_" + w.ID, AgentID: w.AgentID, Kind: subjects.KindRecheck, At: at.UTC(),
		Source: subjects.Source{Type: "wait_for", ID: w.ID}, Trust: subjects.TrustSystem,
		Text: fmt.Sprintf("Recheck of WaitFor %s: %s", w.ID, w.Reason), Data: data,
	}
}

// SystemWakeEnvelope is an operator's system wake.
func SystemWakeEnvelope(id, agentID, text string, at time.Time) subjects.Envelope {
	return subjects.Envelope{
		ID: id, AgentID: agentID, Kind: subjects.KindSystemWake, At: at.UTC(),
		Source: subjects.Source{Type: "system", ID: id}, Trust: subjects.TrustOperator, Text: text,
	}
}
