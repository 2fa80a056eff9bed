package subjects

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
)

// Envelope kinds: the inbox's vocabulary, which every reader of an inbox
// (agents, WaitFor's wakes, the console) shares.
const (
	KindTimerFired    = "timer_fired"
	KindWaitComplete  = "wait_complete"
	KindWaitCancelled = "wait_cancelled"
	KindIntervention  = "intervention"
	KindWakeHint      = "wake_hint"
	KindMessage       = "message"
	KindWaitWoken     = "wait_woken"
	KindRecheck       = "recheck"
	KindSystemWake    = "system_wake"
	KindAnswer        = "answer"
	KindTaskResult    = "task_result"
	// KindMonitorEvent carries a batch of a monitor's events, and
	// KindMonitorStopped says a monitor ended and why.
	KindMonitorEvent   = "monitor_event"
	KindMonitorStopped = "monitor_stopped"
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

// AppendJSONTime appends t as a JSON string the way EncodeJSON writes it.
func AppendJSONTime(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

// AppendJSONString appends s as a JSON string the way EncodeJSON writes it
// (no HTML escaping; control characters, invalid UTF-8, U+2028 and U+2029
// escaped as encoding/json does).
func AppendJSONString(b []byte, s string) []byte {
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
