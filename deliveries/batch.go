package deliveries

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A batch direct get (nats-server 2.11+, a stream with AllowDirect) reads
// up to n messages of one subject from a sequence on in one request: the
// server answers with each message, then an end-of-batch status, or a
// 404 status alone when there is none. The replies carry the stream's
// headers (jetstream.SequenceHeader and the rest).
const (
	statusHeader      = "Status"
	descriptionHeader = "Description"
	numPendingHeader  = "Nats-Num-Pending" // only in a batch's replies
	statusNoMessages  = "404"
	statusEndOfBatch  = "204"
	statusNoResponder = "503"
)

// directBatchRequest is the body of a batch direct get.
type directBatchRequest struct {
	Seq      uint64 `json:"seq"`
	NextFor  string `json:"next_by_subj"`
	Batch    int    `json:"batch"`
	MaxBytes int    `json:"max_bytes,omitempty"`
}

// errNoDirect is a stream that does not answer direct gets (its
// AllowDirect is off: provisioned by an older chime).
var errNoDirect = errors.New("deliveries: the inbox stream does not answer direct gets")

// directSubject is the direct get subject of stream, under js's API
// prefix.
func directSubject(js jetstream.JetStream, stream string) string {
	o := js.Options()
	prefix := "$JS.API."
	switch {
	case o.APIPrefix != "":
		prefix = strings.TrimSuffix(o.APIPrefix, ".") + "."
	case o.Domain != "":
		prefix = "$JS." + o.Domain + ".API."
	}
	return prefix + "DIRECT.GET." + stream
}

// batchAfter reads up to max messages on subject after seq from the
// stream in one round trip, stopping before maxBytes of envelopes (but
// never before the first; deliverySize). A server without batch gets answers the first
// message alone, which is returned alone.
func (r *Reader) batchAfter(ctx context.Context, subject string, seq uint64, max, maxBytes int) ([]Delivery, error) {
	nc := r.replies.nc
	body, err := json.Marshal(directBatchRequest{Seq: seq + 1, NextFor: subject, Batch: max, MaxBytes: maxBytes})
	if err != nil {
		return nil, err
	}
	inbox, replies, done, err := r.replies.open(max + 1)
	if err != nil {
		return nil, fmt.Errorf("direct get: %w", err)
	}
	defer done()
	if err := nc.PublishRequest(r.direct, inbox, body); err != nil {
		return nil, fmt.Errorf("direct get: %w", err)
	}
	out := []Delivery{}
	size := 0
	for {
		var m *nats.Msg
		select {
		case m = <-replies:
		case <-ctx.Done():
			err := ctx.Err()
			if errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("%w: %w", nats.ErrTimeout, err)
			}
			return nil, fmt.Errorf("direct get: %w", err)
		}
		if len(m.Data) == 0 && m.Header.Get(statusHeader) != "" {
			switch status := m.Header.Get(statusHeader); status {
			case statusEndOfBatch:
				return out, nil
			case statusNoMessages:
				if len(out) == 0 {
					return out, nil
				}
				return nil, fmt.Errorf("direct get: a 404 after %d messages", len(out))
			case statusNoResponder:
				return nil, fmt.Errorf("%w: %w", errNoDirect, nats.ErrNoResponders)
			default:
				return nil, fmt.Errorf("direct get: status %s %s", status, m.Header.Get(descriptionHeader))
			}
		}
		d, err := directDelivery(m)
		if err != nil {
			return nil, err
		}
		if n := deliverySize(d.Envelope); len(out) > 0 && size+n > maxBytes {
			// The server stops once it has sent maxBytes, with the
			// message that crosses it: that one waits for the next fetch.
			// The end of the batch follows; it is not waited for.
			return out, nil
		}
		size += deliverySize(d.Envelope)
		out = append(out, d)
		if m.Header.Get(numPendingHeader) == "" || len(out) == max {
			// A server before batch gets sends one message and no end; a
			// full batch's end is not waited for either.
			return out, nil
		}
	}
}

// directDelivery reads one direct get reply.
func directDelivery(m *nats.Msg) (Delivery, error) {
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return Delivery{}, fmt.Errorf("direct get: sequence header %q: %w", m.Header.Get(jetstream.SequenceHeader), err)
	}
	at, err := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
	if err != nil {
		return Delivery{}, fmt.Errorf("direct get: time stamp header: %w", err)
	}
	return Delivery{Seq: seq, StoredAt: at, Envelope: m.Data}, nil
}

// replies routes the replies to a Reader's direct gets: one subscription
// to a wildcard under one inbox for them all, where a subscription of each
// get's own would cost a subscribe and an unsubscribe per fetch.
type replies struct {
	nc      *nats.Conn
	mu      sync.Mutex
	sub     *nats.Subscription // subscribed at the first get
	prefix  string             // <inbox>.
	next    uint64
	waiting map[string]chan *nats.Msg
}

func newReplies(nc *nats.Conn) *replies {
	return &replies{nc: nc, waiting: map[string]chan *nats.Msg{}}
}

// open returns a reply subject of its own and the channel its replies
// come on, which holds n (more are dropped: a get's replies are bounded),
// and done, which forgets them.
func (rs *replies) open(n int) (string, <-chan *nats.Msg, func(), error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.sub == nil {
		prefix := rs.nc.NewInbox() + "."
		sub, err := rs.nc.Subscribe(prefix+"*", rs.route)
		if err != nil {
			return "", nil, nil, err
		}
		rs.sub, rs.prefix = sub, prefix
	}
	rs.next++
	subject := rs.prefix + strconv.FormatUint(rs.next, 36)
	c := make(chan *nats.Msg, n)
	rs.waiting[subject] = c
	return subject, c, func() {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		delete(rs.waiting, subject)
	}, nil
}

// route passes a reply to its get; one for a get that ended is dropped.
func (rs *replies) route(m *nats.Msg) {
	rs.mu.Lock()
	c := rs.waiting[m.Subject]
	rs.mu.Unlock()
	select {
	case c <- m: // a nil c (the get ended) is never ready
	default:
	}
}
