// Package deliveries reads what chime delivered to agents: for operators,
// the last envelopes of an agent's inbox, a live feed of the next ones, and
// which agents have an inbox, each through a consumer that holds no
// durable state (ephemeral, in memory, deleted or expired when the read
// ends), so looking never changes what an agent is given; for agents
// themselves, their reliable read (Inbox: fetch from the cursor chime
// keeps, ack), by subject, with no consumer at all.
package deliveries

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/subjects"
)

// Delivery is one stored inbox envelope and where the stream keeps it:
// the same an agent's own fetch returns.
type Delivery = subjects.InboxDelivery

// Reader reads the inbox stream.
type Reader struct {
	js      jetstream.JetStream
	stream  string
	direct  string // the stream's direct get subject
	replies *replies
	mu      sync.Mutex
	st      jetstream.Stream // looked up once, for agents' acks
}

// NewReader returns a Reader of the inbox stream named stream.
func NewReader(js jetstream.JetStream, stream string) *Reader {
	return &Reader{js: js, stream: stream, direct: directSubject(js, stream), replies: newReplies(js.Conn())}
}

// inactive is how long the server keeps a reader's consumer once its
// reader is gone without deleting it (a crash): long enough to outlive a
// slow fetch, short enough that none piles up.
const inactive = 30 * time.Second

// firstWindow is the span of stream sequences the last n deliveries are
// first looked for in, as a multiple of n; each miss widens it by
// windowGrowth, so finding them takes a few probes however sparse the
// agent's deliveries are among all agents'.
const (
	firstWindow  = 4
	windowGrowth = 16
)

// Page is an agent's last deliveries.
type Page struct {
	// Deliveries are newest first.
	Deliveries []Delivery `json:"deliveries"`
	// LastSeq is the stream's last sequence at the read: a feed that
	// follows after it misses nothing.
	LastSeq uint64 `json:"last_seq"`
}

// Recent returns the agent's last n deliveries.
// The stream has no backward read by subject, so it counts the agent's
// deliveries in a window of sequences before the last (an ephemeral
// consumer's pending count costs the server no read of the messages),
// widens the window until it holds n or the whole stream, then fetches it.
func (r *Reader) Recent(ctx context.Context, agentID string, n int) (*Page, error) {
	st, err := r.js.Stream(ctx, r.stream)
	if err != nil {
		return nil, fmt.Errorf("deliveries: stream %s: %w", r.stream, err)
	}
	info := st.CachedInfo() // the lookup's own STREAM.INFO, just answered
	first, last := info.State.FirstSeq, info.State.LastSeq
	if n <= 0 || info.State.Msgs == 0 {
		return &Page{Deliveries: []Delivery{}, LastSeq: last}, nil
	}
	for window := uint64(firstWindow * n); ; window *= windowGrowth {
		start := first
		if last > window && last-window+1 > first {
			start = last - window + 1
		}
		cons, err := st.CreateConsumer(ctx, ephemeral(agentID, start))
		if err != nil {
			return nil, fmt.Errorf("deliveries: read %s: %w", agentID, err)
		}
		pending := cons.CachedInfo().NumPending
		if pending < uint64(n) && start > first {
			r.drop(st, cons)
			continue
		}
		list, err := fetchLast(ctx, cons, pending, n)
		r.drop(st, cons)
		if err != nil {
			return nil, fmt.Errorf("deliveries: read %s: %w", agentID, err)
		}
		if len(list) > 0 {
			last = max(last, list[0].Seq) // stored since the stream's info
		}
		return &Page{Deliveries: list, LastSeq: last}, nil
	}
}

// ephemeral is the config of a consumer of agentID's inbox from start:
// no name, no acks, in memory, gone after inactive.
func ephemeral(agentID string, start uint64) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		FilterSubject: subjects.Inbox(agentID), DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: start,
		AckPolicy: jetstream.AckNonePolicy, MemoryStorage: true, Replicas: 1, InactiveThreshold: inactive,
	}
}

// drop deletes a reader's consumer; one left behind expires on its own.
func (r *Reader) drop(st jetstream.Stream, cons jetstream.Consumer) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = st.DeleteConsumer(ctx, cons.CachedInfo().Name)
}

// fetchBatch is how many messages one fetch asks for, and fetchWait how
// long it may take: they are stored already, so they come at once.
const (
	fetchBatch = 256
	fetchWait  = 5 * time.Second
)

// fetchLast reads pending messages from cons and returns the last n,
// newest first.
func fetchLast(ctx context.Context, cons jetstream.Consumer, pending uint64, n int) ([]Delivery, error) {
	ring := make([]Delivery, 0, n)
	next := 0 // where the next one goes once the ring is full
	keep := func(d Delivery) {
		if len(ring) < n {
			ring = append(ring, d)
			return
		}
		ring[next] = d
		next = (next + 1) % n
	}
	for read := uint64(0); read < pending; {
		got, err := fetch(ctx, cons, int(min(pending-read, fetchBatch)), keep)
		if err != nil {
			return nil, err
		}
		if got == 0 {
			break // pending counted messages since removed (age, limits)
		}
		read += uint64(got)
	}
	out := make([]Delivery, 0, len(ring))
	for i := len(ring) - 1; i >= 0; i-- {
		out = append(out, ring[(next+i)%len(ring)])
	}
	return out, nil
}

// fetch reads at most batch messages from cons into keep and says how
// many it read.
func fetch(ctx context.Context, cons jetstream.Consumer, batch int, keep func(Delivery)) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, fetchWait)
	defer cancel()
	msgs, err := cons.Fetch(batch, jetstream.FetchContext(ctx))
	if err != nil {
		return 0, err
	}
	got := 0
	for m := range msgs.Messages() {
		d, err := delivery(m)
		if err != nil {
			return got, err
		}
		keep(d)
		got++
	}
	return got, msgs.Error()
}

func delivery(m jetstream.Msg) (Delivery, error) {
	md, err := m.Metadata()
	if err != nil {
		return Delivery{}, err
	}
	return Delivery{Seq: md.Sequence.Stream, StoredAt: md.Timestamp, Envelope: json.RawMessage(m.Data())}, nil
}

// ErrBehind ends a feed whose reader fell too far behind.
var ErrBehind = errors.New("deliveries: the reader fell behind")

// Feed is a live feed of one agent's deliveries.
type Feed struct {
	c    chan Delivery
	cc   jetstream.ConsumeContext
	mu   sync.Mutex
	done bool
	err  error
}

// C yields the deliveries in stream order; it is closed when the feed
// ends: its context ended, or its reader fell behind (Err).
func (f *Feed) C() <-chan Delivery { return f.c }

// Err says why the feed ended: ErrBehind, or nil.
func (f *Feed) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// Follow feeds agentID's deliveries stored after sequence after (0: from
// now on) until ctx ends. At most buffer wait unread: a reader that falls
// further behind ends the feed (ErrBehind) rather than hold the stream's
// messages in memory, and may follow again from the last sequence it read.
func (r *Reader) Follow(ctx context.Context, agentID string, after uint64, buffer int) (*Feed, error) {
	st, err := r.js.Stream(ctx, r.stream)
	if err != nil {
		return nil, fmt.Errorf("deliveries: stream %s: %w", r.stream, err)
	}
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subjects.Inbox(agentID)}, DeliverPolicy: jetstream.DeliverNewPolicy, InactiveThreshold: inactive,
	}
	if after > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, after+1
	}
	cons, err := st.OrderedConsumer(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("deliveries: follow %s: %w", agentID, err)
	}
	f := &Feed{c: make(chan Delivery, buffer)}
	// The callback may end the feed, and stop f.cc, before Consume has
	// returned (a resume with more waiting than buffer): holding f.mu until
	// f.cc is set makes it wait for it.
	f.mu.Lock()
	f.cc, err = cons.Consume(func(m jetstream.Msg) {
		d, err := delivery(m)
		if err != nil {
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.done {
			return
		}
		select {
		case f.c <- d:
		default:
			f.end(ErrBehind)
		}
	})
	f.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("deliveries: follow %s: %w", agentID, err)
	}
	context.AfterFunc(ctx, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.end(nil)
	})
	return f, nil
}

// end closes the feed once; f.mu is held.
func (f *Feed) end(err error) {
	if f.done {
		return
	}
	f.done, f.err = true, err
	close(f.c)
	f.cc.Stop()
}

// Agents returns the agents with deliveries in the inbox stream, and how
// many each has stored.
func (r *Reader) Agents(ctx context.Context) (map[string]uint64, error) {
	st, err := r.js.Stream(ctx, r.stream)
	if err != nil {
		return nil, fmt.Errorf("deliveries: stream %s: %w", r.stream, err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subjects.InboxWildcard))
	if err != nil {
		return nil, fmt.Errorf("deliveries: stream %s: %w", r.stream, err)
	}
	out := make(map[string]uint64, len(info.State.Subjects))
	for subj, n := range info.State.Subjects {
		if id, ok := strings.CutSuffix(strings.TrimPrefix(subj, "agent."), ".inbox"); ok {
			out[id] = n
		}
	}
	return out, nil
}
