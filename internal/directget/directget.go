// Package directget reads a stream's messages with JetStream direct gets
// ($JS.API.DIRECT.GET.<stream>, a stream with AllowDirect): answered by
// any server that holds the stream, with no consumer. It owns the requests
// (by sequence, the last of a subject, the next of a subject filter in
// batches, the last of each subject of a filter up to a sequence), the
// server's status answers (204 the end of a batch with its pending count,
// 404 nothing, 408 a bad request, 413 too many subjects, 503 no responder),
// the JetStream API prefix (a domain or an imported API), and the routing
// of a batch's replies: a subscription of the request's own, or one shared
// by the requests of a connection (Replies). Each request is retried as
// its Stream's Retry says; chime's reads give kvrec.Retried.
package directget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The headers of the server's answers.
const (
	statusHeader      = "Status"
	descriptionHeader = "Description"
	numPendingHeader  = "Nats-Num-Pending" // in a batch's messages and its end
)

// The server's status answers.
const (
	statusEndOfBatch  = "204"
	statusNotFound    = "404"
	statusBadRequest  = "408"
	statusTooMany     = "413"
	statusNoResponder = "503"
)

// MaxMultiLast is how many subjects a multi-last get answers for
// (nats-server's maxAllowedResponses); past it the server answers 413.
const MaxMultiLast = 1024

var (
	// ErrBadRequest is a request the server refused (408): fields that do
	// not go together, or none set.
	ErrBadRequest = errors.New("direct get: bad request")
	// ErrTooMany is a multi-last get refused for matching more subjects
	// than the server answers for (413).
	ErrTooMany = errors.New("direct get: too many subjects for one multi-last get")
	// ErrNoDirect is a request nothing answered (503): the stream does not
	// allow direct gets, or no server holding it has it loaded yet (a
	// restart). It is nats.ErrNoResponders, so retries take it as
	// transient.
	ErrNoDirect = fmt.Errorf("direct get: no responder: %w", nats.ErrNoResponders)
)

// StatusError is an answer with a status that is no other error of
// this package, or a 404 after some of a batch's messages (a message the
// server found and then failed to load).
type StatusError struct {
	Status, Description string
	// After is how many messages came before the status.
	After int
}

func (e *StatusError) Error() string {
	if e.After > 0 {
		return fmt.Sprintf("direct get: status %s %s after %d messages", e.Status, e.Description, e.After)
	}
	return fmt.Sprintf("direct get: status %s %s", e.Status, e.Description)
}

// Request is one direct get (nats-server's JSApiMsgGetRequest). Set one of
// Seq alone, LastFor, NextFor (with Seq, where to start), or MultiLast
// (with Seq and UpToSeq, the range); Batch makes NextFor and MultiLast
// answer up to Batch messages, and MaxBytes stops a batch once it has sent
// that many bytes (the message that crosses it included).
type Request struct {
	Seq       uint64   `json:"seq,omitempty"`
	LastFor   string   `json:"last_by_subj,omitempty"`
	NextFor   string   `json:"next_by_subj,omitempty"`
	MultiLast []string `json:"multi_last,omitempty"`
	UpToSeq   uint64   `json:"up_to_seq,omitempty"`
	Batch     int      `json:"batch,omitempty"`
	MaxBytes  int      `json:"max_bytes,omitempty"`
}

// isBatch reports whether the server answers r with messages and then an
// end of batch, rather than one message.
func (r *Request) isBatch() bool { return r.Batch > 0 || len(r.MultiLast) > 0 }

// replies is how many replies r's answer has at most: its messages and
// its end.
func (r *Request) replies() int {
	switch {
	case r.Batch > 0:
		return r.Batch + 1
	case len(r.MultiLast) > 0:
		return MaxMultiLast + 1
	}
	return 1
}

// Msg is one message of an answer.
type Msg struct {
	Subject string
	Seq     uint64
	Header  nats.Header
	Data    []byte
}

// Time is when the stream stored m.
func (m *Msg) Time() (time.Time, error) {
	at, err := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
	if err != nil {
		return time.Time{}, fmt.Errorf("direct get: time stamp header: %w", err)
	}
	return at, nil
}

// Deleted reports whether m is a KV bucket's delete or purge, or a marker
// the server left where a message was removed.
func (m *Msg) Deleted() bool {
	op := m.Header.Get("KV-Operation")
	return op == "DEL" || op == "PURGE" || m.Header.Get(jetstream.MarkerReasonHeader) != ""
}

// Answer is what one request returned.
type Answer struct {
	// Msgs are the messages, in stream order; none when nothing matched.
	Msgs []Msg
	// Pending is, for a batch, how many matching messages the stream holds
	// after the last one returned (the end of batch's count); zero for a
	// request that is no batch, or a server that answered one message to a
	// batch (one before batch gets).
	Pending uint64
}

// Retry runs a request's attempts until one answers, one fails for good,
// or ctx ends. chime's is kvrec.Retried[*Answer] (kvrec reads through this
// package, so the policy is given to it, not imported).
type Retry func(ctx context.Context, attempt func(context.Context) (*Answer, error)) (*Answer, error)

// Stream reads one stream by direct gets. It is safe for concurrent use.
type Stream struct {
	nc      *nats.Conn
	subject string   // the stream's direct get subject
	replies *Replies // nil: each batch subscribes for its own replies
	retry   Retry    // nil: one attempt
}

// Option configures a Stream.
type Option func(*Stream)

// WithReplies routes the replies of batches through rs (which must be of
// the Stream's connection) rather than a subscription each: a subscribe
// and an unsubscribe less per batch.
func WithReplies(rs *Replies) Option { return func(s *Stream) { s.replies = rs } }

// WithRetry retries each request as retry does.
func WithRetry(retry Retry) Option { return func(s *Stream) { s.retry = retry } }

// New returns a reader of stream through js's connection and API prefix.
func New(js jetstream.JetStream, stream string, opts ...Option) *Stream {
	s := &Stream{nc: js.Conn(), subject: apiPrefix(js.Options()) + "DIRECT.GET." + stream}
	for _, o := range opts {
		o(s)
	}
	return s
}

// apiPrefix is where the JetStream API of o is.
func apiPrefix(o jetstream.JetStreamOptions) string {
	switch {
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	}
	return "$JS.API."
}

// Get sends req and returns its answer. A request that finds nothing
// (404) answers no messages, and no error.
func (s *Stream) Get(ctx context.Context, req Request) (*Answer, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("direct get: %w", err)
	}
	attempt := func(ctx context.Context) (*Answer, error) { return s.once(ctx, &req, body) }
	if s.retry == nil {
		return attempt(ctx)
	}
	return s.retry(ctx, attempt)
}

// Walk calls fn for every message matching req, a batch (NextFor or
// MultiLast with Batch), and those of the requests after it, each from the
// sequence after the last message read, until one says nothing is left.
// Each request is one consistent read; between them a message that moves
// past where the walk is (a KV key written again) comes again at its new
// place. fn's error ends the walk and is returned.
func (s *Stream) Walk(ctx context.Context, req Request, fn func(*Msg) error) error {
	if !req.isBatch() {
		return fmt.Errorf("%w: a walk reads in batches", ErrBadRequest)
	}
	req.Seq = max(req.Seq, 1)
	for {
		a, err := s.Get(ctx, req)
		if err != nil {
			return err
		}
		for i := range a.Msgs {
			if err := fn(&a.Msgs[i]); err != nil {
				return err
			}
		}
		if a.Pending == 0 || len(a.Msgs) == 0 {
			return nil
		}
		req.Seq = a.Msgs[len(a.Msgs)-1].Seq + 1
	}
}

// once sends req (encoded as body) once and reads its answer. A request
// that is no batch has one reply, read through the connection's shared
// request subscription; a batch reads its replies until its end.
func (s *Stream) once(ctx context.Context, req *Request, body []byte) (*Answer, error) {
	a := &Answer{Msgs: []Msg{}}
	if !req.isBatch() {
		m, err := s.nc.RequestWithContext(ctx, s.subject, body)
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, ErrNoDirect
		}
		if err != nil {
			return nil, fmt.Errorf("direct get: %w", err)
		}
		if _, err := a.add(m, false); err != nil {
			return nil, err
		}
		return a, nil
	}
	in, done, err := s.subscribe(req.replies())
	if err != nil {
		return nil, fmt.Errorf("direct get: %w", err)
	}
	defer done()
	if err := s.nc.PublishRequest(s.subject, in.subject, body); err != nil {
		return nil, fmt.Errorf("direct get: %w", err)
	}
	for {
		m, err := in.msg(ctx)
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, ErrNoDirect // a subscription's own reading of a 503
		}
		if err != nil {
			return nil, fmt.Errorf("direct get: %w", err)
		}
		if end, err := a.add(m, true); end || err != nil {
			if err != nil {
				return nil, err
			}
			return a, nil
		}
	}
}

// add takes one reply into a, reporting whether it ends the answer: a
// status, a request's one message, or a message of a batch without a
// pending count (a server before batch gets answers one message alone).
func (a *Answer) add(m *nats.Msg, batch bool) (bool, error) {
	// A stored message keeps its own headers, Status included (anyone may
	// publish one into a stream): only the server's answers come without
	// the stored message's sequence.
	if status := m.Header.Get(statusHeader); status != "" && len(m.Data) == 0 && m.Header.Get(jetstream.SequenceHeader) == "" {
		return true, a.status(status, m.Header)
	}
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	subject := m.Header.Get(jetstream.SubjectHeader)
	if err != nil || subject == "" {
		return true, fmt.Errorf("direct get: a message without its sequence or subject (%q, %q)",
			m.Header.Get(jetstream.SequenceHeader), subject)
	}
	a.Msgs = append(a.Msgs, Msg{Subject: subject, Seq: seq, Header: m.Header, Data: m.Data})
	return !batch || m.Header.Get(numPendingHeader) == "", nil
}

// status reads a status answer into a, or its error.
func (a *Answer) status(status string, h nats.Header) error {
	switch status {
	case statusEndOfBatch:
		var err error
		if a.Pending, err = strconv.ParseUint(h.Get(numPendingHeader), 10, 64); err != nil {
			return fmt.Errorf("direct get: end of batch without a pending count: %w", err)
		}
		return nil
	case statusNotFound:
		if len(a.Msgs) == 0 {
			return nil
		}
	case statusBadRequest:
		return fmt.Errorf("%w: %s", ErrBadRequest, h.Get(descriptionHeader))
	case statusTooMany:
		return ErrTooMany
	case statusNoResponder:
		return ErrNoDirect
	}
	return &StatusError{Status: status, Description: h.Get(descriptionHeader), After: len(a.Msgs)}
}
