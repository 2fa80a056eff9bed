package subjects

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

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

// TimerFiredMsg is the inbox message of a timer fire, byte for byte what
// TimerFiredEnvelope(f).Msg() gives, encoded without reflection: a burst
// of fires spends its time here otherwise.
func TimerFiredMsg(f *TimerFired) *nats.Msg {
	b := make([]byte, 0, 320+len(f.Text))
	id := f.EnvelopeID()
	b = append(b, `{"id":`...)
	b = appendString(b, id)
	b = append(b, `,"agent_id":`...)
	b = appendString(b, f.AgentID)
	b = append(b, `,"kind":"`+KindTimerFired+`","at":`...)
	b = appendTime(b, f.FiredAt)
	b = append(b, `,"source":{"type":"timer","id":`...)
	b = appendString(b, f.TimerID)
	b = append(b, `},"trust":"`+TrustSystem+`"`...)
	if f.Text != "" {
		b = append(b, `,"text":`...)
		b = appendString(b, f.Text)
	}
	b = append(b, `,"data":{"timer_id":`...)
	b = appendString(b, f.TimerID)
	b = append(b, `,"occurrence":`...)
	b = strconv.AppendInt(b, f.Occurrence, 10)
	b = append(b, `,"due_at":`...)
	b = appendTime(b, f.DueAt)
	b = append(b, `,"fired_at":`...)
	b = appendTime(b, f.FiredAt)
	b = append(b, "}}"...)
	m := &nats.Msg{Subject: Inbox(f.AgentID), Data: b, Header: nats.Header{
		HeaderKind: {KindTimerFired}, HeaderMsgID: {id},
	}}
	return m
}

func appendTime(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

// appendString appends s as a JSON string the way EncodeJSON writes it
// (no HTML escaping; control characters, invalid UTF-8, U+2028 and U+2029
// escaped as encoding/json does).
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
