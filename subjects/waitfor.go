package subjects

import (
	"encoding/json"
	"slices"
	"strings"
	"time"
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
)

// WakeKinds lists every accepted wake, in the order prompts show them.
func WakeKinds() []WakeKind {
	return []WakeKind{WakeOperatorInput, WakeTaskResult, WakeExternal, WakeTimer, WakeSystem}
}

// needsResource says whether a wake names the thing it waits on.
func (w WakeKind) needsResource() bool { return w == WakeTaskResult || w == WakeTimer }

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
}

// DecodeWaitFor validates a WaitFor request.
func DecodeWaitFor(data []byte) (*WaitForSpec, error) {
	var req WaitForRequest
	if err := DecodeStrict(data, &req); err != nil {
		return nil, err
	}
	spec := &WaitForSpec{Wake: WakeKind(req.Wake), Resource: req.Resource, Reason: strings.TrimSpace(req.Reason),
		Delivery: Delivery(req.Delivery), WorkItemID: req.WorkItemID}
	switch {
	case req.Wake == "":
		return nil, invalid("wake is required")
	case !slices.Contains(WakeKinds(), spec.Wake):
		return nil, invalid("wake must be one of " + joinValues(WakeKinds()) + ", not " + req.Wake)
	case spec.Wake.needsResource() && req.Resource == "":
		return nil, invalid("resource is required for wake " + req.Wake)
	case spec.Reason == "":
		return nil, invalid("reason is required")
	case req.Delivery == "":
		return nil, invalid("delivery is required")
	case !slices.Contains(Deliveries(), spec.Delivery):
		return nil, invalid("delivery must be one of " + joinValues(Deliveries()) + ", not " + req.Delivery)
	}
	if req.Resource != "" {
		if err := ValidateID("resource", req.Resource); err != nil {
			return nil, err
		}
	}
	if req.WorkItemID != "" {
		if err := ValidateID("work_item_id", req.WorkItemID); err != nil {
			return nil, err
		}
	}
	if !isNull(req.RecheckAfterMs) {
		ms, err := positiveInt("recheck_after_ms", req.RecheckAfterMs, maxRecheckMs)
		if err != nil {
			return nil, err
		}
		spec.RecheckAfter = time.Duration(ms) * time.Millisecond
	}
	return spec, nil
}

func invalid(msg string) *Error { return &Error{Code: CodeInvalidRequest, Message: msg} }

func joinValues[T ~string](vs []T) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = string(v)
	}
	return strings.Join(s, ", ")
}
