package interventions

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/chime-nats/chime/subjects"
)

// Intervention actions.
const (
	ActionMessage = "message"
	ActionPause   = "pause"
	ActionResume  = "resume"
	ActionStop    = "stop"
)

// InterventionRequest is the body of agent.<id>.intervention.
type InterventionRequest struct {
	Text   string `json:"text,omitempty"`
	Action string `json:"action"`
}

// InterventionActions lists the accepted actions.
func InterventionActions() []string {
	return []string{ActionMessage, ActionPause, ActionResume, ActionStop}
}

// DecodeIntervention decodes and validates an intervention.
func DecodeIntervention(data []byte) (*InterventionRequest, error) {
	var r InterventionRequest
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return nil, err
	}
	switch r.Action {
	case ActionMessage, ActionPause, ActionResume, ActionStop:
	case "":
		return nil, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "action is required: message, pause, resume or stop"}
	default:
		return nil, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: fmt.Sprintf("unknown action %q: message, pause, resume or stop", r.Action)}
	}
	if r.Action == ActionMessage && strings.TrimSpace(r.Text) == "" {
		return nil, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "text is required for action message"}
	}
	return &r, nil
}

// Intervention is the intervention.apply.<agent> event.
type Intervention struct {
	ID      string    `json:"id"`
	AgentID string    `json:"agent_id"`
	Action  string    `json:"action"`
	Text    string    `json:"text,omitempty"`
	At      time.Time `json:"at"`
}

// CancelText is what cancelled waits carry.
func (iv *Intervention) CancelText() string {
	if iv.Text != "" {
		return iv.Text
	}
	return "Wait cancelled by intervention (" + iv.Action + ")."
}

// InterventionEnvelope is the delivery of the intervention itself.
func InterventionEnvelope(iv *Intervention) subjects.Envelope {
	data, _ := json.Marshal(map[string]string{"action": iv.Action})
	return subjects.Envelope{
		ID: "intervention_" + iv.ID, AgentID: iv.AgentID, Kind: subjects.KindIntervention, At: iv.At.UTC(),
		Source: subjects.Source{Type: "intervention", ID: iv.ID}, Trust: subjects.TrustOperator, Text: iv.Text, Data: data,
	}
}
