package subjects

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// Envelope kinds.
const (
	KindTimerFired = "timer_fired"
)

// Trust levels of a delivery.
const (
	TrustOperator = "operator"
	TrustSystem   = "system"
	TrustExternal = "external"
)

// Headers chime sets on inbox deliveries.
const (
	HeaderKind  = "Chime-Kind"
	HeaderMsgID = "Nats-Msg-Id"
)

// Source says what produced a delivery.
type Source struct {
	Type string `json:"type"`
	ID   string `json:"id"`
}

// Envelope is one delivery to agent.<id>.inbox.
type Envelope struct {
	ID      string          `json:"id"`
	AgentID string          `json:"agent_id"`
	Kind    string          `json:"kind"`
	At      time.Time       `json:"at"`
	Source  Source          `json:"source"`
	Trust   string          `json:"trust"`
	Text    string          `json:"text,omitempty"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// TimerFiredData is the data of a timer_fired delivery.
type TimerFiredData struct {
	TimerID    string    `json:"timer_id"`
	Occurrence int64     `json:"occurrence"`
	DueAt      time.Time `json:"due_at"`
	FiredAt    time.Time `json:"fired_at"`
}

// TimerFiredEnvelope builds the inbox delivery of a fire event.
func TimerFiredEnvelope(f *TimerFired) Envelope {
	data, _ := json.Marshal(TimerFiredData{TimerID: f.TimerID, Occurrence: f.Occurrence, DueAt: f.DueAt, FiredAt: f.FiredAt})
	return Envelope{
		ID:      f.EnvelopeID(),
		AgentID: f.AgentID,
		Kind:    KindTimerFired,
		At:      f.FiredAt,
		Source:  Source{Type: "timer", ID: f.TimerID},
		Trust:   TrustSystem,
		Text:    f.Text,
		Data:    data,
	}
}

// Msg is the envelope as the inbox message: on agent.<id>.inbox, headers
// Chime-Kind and Nats-Msg-Id (the envelope ID, so a repeat is dropped).
func (e *Envelope) Msg() (*nats.Msg, error) {
	data, err := EncodeJSON(e)
	if err != nil {
		return nil, fmt.Errorf("encode envelope %s: %w", e.ID, err)
	}
	m := &nats.Msg{Subject: Inbox(e.AgentID), Data: data, Header: nats.Header{}}
	m.Header.Set(HeaderKind, e.Kind)
	m.Header.Set(HeaderMsgID, e.ID)
	return m, nil
}

// EncodeJSON is json.Marshal without HTML escaping: external text full of
// <, > and & would otherwise grow sixfold on its way to the inbox.
func EncodeJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
