package deliveries

import (
	"encoding/json"
	"github.com/chime-nats/chime/subjects"
	"strconv"
	"time"
)

// An agent's reliable read of its own inbox, served by chime: no JetStream
// right of the agent's is involved (a consumer's deliver subject and a
// pull's reply subject are the agent's to choose, and the server delivers
// there with the stream's rights), and the engine keeps no consumer per
// agent. chime keeps the agent's cursor, the last stream sequence it
// acked, in its record in chime_agents.
const (
	// ActionInboxFetch returns the agent's deliveries after its cursor.
	ActionInboxFetch = "inbox.fetch"
	// ActionInboxAck moves the agent's cursor.
	ActionInboxAck = "inbox.ack"
)

// Inbox fetch bounds.
const (
	DefaultInboxFetch = 64
	MaxInboxFetch     = 256
	// MaxInboxWait is the longest a fetch waits for a first delivery.
	MaxInboxWait = 5 * time.Second
)

// InboxFetchRequest is the body of inbox.fetch. After defaults to the
// agent's cursor: what it has not acked comes again.
type InboxFetchRequest struct {
	Max    json.RawMessage `json:"max,omitempty"`
	After  json.RawMessage `json:"after,omitempty"`
	WaitMs json.RawMessage `json:"wait_ms,omitempty"`
}

// InboxFetch is a validated inbox.fetch request.
type InboxFetch struct {
	Max   int
	After *uint64
	Wait  time.Duration
}

// DecodeInboxFetch decodes an inbox.fetch body.
func DecodeInboxFetch(data []byte) (*InboxFetch, error) {
	var r InboxFetchRequest
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return nil, err
	}
	out := &InboxFetch{Max: DefaultInboxFetch}
	if len(r.Max) > 0 {
		n, err := wholeNumber("max", r.Max, 1, MaxInboxFetch)
		if err != nil {
			return nil, err
		}
		out.Max = int(n)
	}
	if len(r.After) > 0 {
		n, err := wholeNumber("after", r.After, 0, 1<<62)
		if err != nil {
			return nil, err
		}
		after := uint64(n)
		out.After = &after
	}
	if len(r.WaitMs) > 0 {
		n, err := wholeNumber("wait_ms", r.WaitMs, 0, MaxInboxWait.Milliseconds())
		if err != nil {
			return nil, err
		}
		out.Wait = time.Duration(n) * time.Millisecond
	}
	return out, nil
}

// InboxAckRequest is the body of inbox.ack: every delivery up to and
// including Seq is handled.
type InboxAckRequest struct {
	Seq json.RawMessage `json:"seq"`
}

// DecodeInboxAck decodes an inbox.ack body and returns its sequence.
func DecodeInboxAck(data []byte) (uint64, error) {
	var r InboxAckRequest
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return 0, err
	}
	if len(r.Seq) == 0 {
		return 0, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "seq is required"}
	}
	n, err := wholeNumber("seq", r.Seq, 1, 1<<62)
	return uint64(n), err
}

// wholeNumber reads a JSON integer in [lo, hi].
func wholeNumber(field string, raw json.RawMessage, lo, hi int64) (int64, error) {
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: field + " must be a whole number from " +
			strconv.FormatInt(lo, 10) + " to " + strconv.FormatInt(hi, 10)}
	}
	return n, nil
}

// InboxDelivery is one stored inbox envelope and its stream sequence,
// which the agent acks (and a feed resumes after).
type InboxDelivery struct {
	Seq      uint64          `json:"seq"`
	StoredAt time.Time       `json:"stored_at"`
	Envelope json.RawMessage `json:"envelope"`
}

// InboxFetchReply is the agent's next deliveries, oldest first, and its
// cursor.
type InboxFetchReply struct {
	Deliveries []InboxDelivery `json:"deliveries"`
	// Acked is the agent's cursor: every delivery up to it is handled.
	Acked uint64 `json:"acked"`
}

// InboxAckReply is the agent's cursor after an ack.
type InboxAckReply struct {
	Acked uint64 `json:"acked"`
}
