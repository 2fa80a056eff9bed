package deliveries

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/internal/directget"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/subjects"
)

// Inbox serves an agent's own reliable read of its inbox (inbox.fetch,
// inbox.ack): deliveries after the cursor chime keeps in the agent's
// record, read by subject from the stream, so no JetStream right of the
// agent's and no consumer per agent is involved. What is not acked comes
// again at the next fetch; an envelope's ID tells a repeat.
type Inbox struct {
	reader *Reader
	agents *agents.Store

	mu      sync.Mutex
	waiting map[string]int // fetches waiting for a delivery, by agent
	total   int
}

// Waits a fetch may hold open for a first delivery: per agent, and in
// all on this replica. Beyond them a fetch answers at once, empty.
const (
	maxWaitsPerAgent = 4
	maxWaits         = 256
)

// NewInbox returns the agents' inbox reads over reader and the agents'
// records.
func NewInbox(reader *Reader, agents *agents.Store) *Inbox {
	return &Inbox{reader: reader, agents: agents, waiting: map[string]int{}}
}

// Fetch returns up to req.Max of the agent's deliveries after req.After
// (or after its cursor), oldest first; with req.Wait and none there, it
// waits that long for the next one.
func (i *Inbox) Fetch(ctx context.Context, agentID string, req *InboxFetch) (*InboxFetchReply, error) {
	st, _, err := i.agents.Get(ctx, agentID)
	if err != nil {
		return nil, err
	}
	after := st.InboxAcked
	if req.After != nil {
		after = *req.After
	}
	out := &InboxFetchReply{Acked: st.InboxAcked, Deliveries: []Delivery{}}
	if out.Deliveries, err = i.reader.after(ctx, agentID, after, req.Max); err != nil || len(out.Deliveries) > 0 || req.Wait <= 0 {
		return out, err
	}
	if !i.reserve(agentID) {
		return out, nil
	}
	defer i.release(agentID)
	f, err := i.reader.Follow(ctx, agentID, after)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	wctx, cancel := context.WithTimeout(ctx, req.Wait)
	defer cancel()
	list, err := f.Next(wctx, req.Max)
	if err != nil && wctx.Err() != nil && ctx.Err() == nil {
		return out, nil // nothing came: an empty answer, not an error
	}
	if err != nil {
		return nil, err
	}
	out.Deliveries = list
	return out, nil
}

// storeLag is how long a read that saw a delivery published waits before
// it reads the stream again for it (doubling while it is not there).
const storeLag = 2 * time.Millisecond

func (i *Inbox) reserve(agentID string) bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.waiting[agentID] >= maxWaitsPerAgent || i.total >= maxWaits {
		return false
	}
	i.waiting[agentID]++
	i.total++
	return true
}

func (i *Inbox) release(agentID string) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.waiting[agentID]--; i.waiting[agentID] == 0 {
		delete(i.waiting, agentID)
	}
	i.total--
}

// Ack moves the agent's cursor up to seq, which must be a sequence the
// inbox stream has reached: one a read here has returned, or else one
// the stream's info says it has.
func (i *Inbox) Ack(ctx context.Context, agentID string, seq uint64) (*InboxAckReply, error) {
	if seq > i.reader.last.Load() {
		last, err := i.reader.lastSeq(ctx)
		if err != nil {
			return nil, err
		}
		if seq > last {
			return nil, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "seq " + strconv.FormatUint(seq, 10) +
				" is beyond the inbox's last delivery " + strconv.FormatUint(last, 10)}
		}
	}
	acked, err := i.agents.InboxAck(ctx, agentID, seq)
	if err != nil {
		return nil, err
	}
	return &InboxAckReply{Acked: acked}, nil
}

// lastSeq is the inbox stream's last sequence, from its info.
func (r *Reader) lastSeq(ctx context.Context) (uint64, error) {
	last, err := kvrec.Retried(ctx, func(ctx context.Context) (uint64, error) {
		st, err := r.js.Stream(ctx, r.stream)
		if err != nil {
			return 0, err
		}
		return st.CachedInfo().State.LastSeq, nil
	})
	if err != nil {
		return 0, fmt.Errorf("deliveries: inbox stream: %w", err)
	}
	r.seen(last)
	return last, nil
}

// after reads up to max of the agent's deliveries after seq, oldest
// first, in one round trip: a batch direct get by subject, so a fetch costs
// one request however many deliveries it returns or other agents have.
// The reply must fit the server's max payload: it holds what fits, and
// the rest comes at the next fetch. A stream that does not answer direct
// gets (provisioned by an older chime) is read a message get each.
func (r *Reader) after(ctx context.Context, agentID string, seq uint64, max int) ([]Delivery, error) {
	subject := subjects.Inbox(agentID)
	budget := replyBudget(r.js.Conn().MaxPayload())
	out, err := kvrec.Retried(ctx, func(ctx context.Context) ([]Delivery, error) {
		out, err := r.batchAfter(ctx, subject, seq, max, budget)
		if errors.Is(err, directget.ErrNoDirect) {
			return r.eachAfter(ctx, subject, seq, max, budget)
		}
		return out, err
	})
	if err != nil {
		return nil, fmt.Errorf("deliveries: inbox of %s after %d: %w", agentID, seq, err)
	}
	if len(out) > 0 {
		r.seen(out[len(out)-1].Seq)
	}
	return out, nil
}

// seen notes that the stream has reached seq.
func (r *Reader) seen(seq uint64) {
	for last := r.last.Load(); seq > last && !r.last.CompareAndSwap(last, seq); last = r.last.Load() {
	}
}

// eachAfter is after by one message get per delivery, through a stream
// handle looked up now, whose config says how to get (direct or not).
func (r *Reader) eachAfter(ctx context.Context, subject string, seq uint64, max, maxBytes int) ([]Delivery, error) {
	st, err := r.js.Stream(ctx, r.stream)
	if err != nil {
		return nil, err
	}
	out := []Delivery{}
	for size := 0; len(out) < max; {
		m, err := st.GetMsg(ctx, seq+1, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, err
		}
		if size += deliverySize(m.Data); len(out) > 0 && size > maxBytes {
			break
		}
		out = append(out, Delivery{Seq: m.Sequence, StoredAt: m.Time, Envelope: m.Data})
		seq = m.Sequence
	}
	return out, nil
}

// replyBudget is how many bytes of envelopes (deliverySize) a fetch reply
// may hold to fit maxPayload: the reply's own fields take the rest.
func replyBudget(maxPayload int64) int {
	return int(max(maxPayload-replyOverhead, 1))
}

// Room in a fetch reply for what is not an envelope: the reply's fields,
// and each delivery's seq and stored_at.
const (
	replyOverhead    = 64
	deliveryOverhead = 96
)

// deliverySize is what one delivery takes in a fetch reply: its envelope
// as the reply's JSON encoding writes it (which escapes <, > and & as
// \u003c and the like) and its other fields.
func deliverySize(envelope []byte) int {
	n := len(envelope) + deliveryOverhead
	for _, c := range envelope {
		if c == '<' || c == '>' || c == '&' {
			n += 5
		}
	}
	return n
}

// Waiting reports how many fetches wait for a delivery on this replica.
func (i *Inbox) Waiting() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.total
}
