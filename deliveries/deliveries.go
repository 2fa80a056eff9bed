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
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/directget"
	"github.com/chime-nats/chime/subjects"
)

// Delivery is one stored inbox envelope and where the stream keeps it:
// the same an agent's own fetch returns.
type Delivery = InboxDelivery

// Reader reads the inbox stream.
type Reader struct {
	js     jetstream.JetStream
	stream string
	// direct reads the stream by direct gets, the replies of all of them
	// through one subscription.
	direct *directget.Stream
	// last is the highest sequence a read here has seen the stream reach:
	// an ack up to it needs no look at the stream.
	last atomic.Uint64
}

// NewReader returns a Reader of the inbox stream named stream.
func NewReader(js jetstream.JetStream, stream string) *Reader {
	direct := directget.New(js, stream, directget.WithReplies(directget.NewReplies(js.Conn())))
	return &Reader{js: js, stream: stream, direct: direct}
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
	last := newLastN(n)
	for read := uint64(0); read < pending; {
		got, err := fetch(ctx, cons, int(min(pending-read, fetchBatch)), last.keep)
		if err != nil {
			return nil, err
		}
		if got == 0 {
			break // pending counted messages since removed (age, limits)
		}
		read += uint64(got)
	}
	return last.newestFirst(), nil
}

// lastN keeps the last n deliveries it is given, in a ring.
type lastN struct {
	ring []Delivery
	next int // where the next one goes once the ring is full
	n    int
}

func newLastN(n int) *lastN { return &lastN{ring: make([]Delivery, 0, min(n, fetchBatch)), n: n} }

func (l *lastN) keep(d Delivery) {
	if len(l.ring) < l.n {
		l.ring = append(l.ring, d)
		return
	}
	l.ring[l.next] = d
	l.next = (l.next + 1) % l.n
}

// newestFirst is what it kept, the newest first.
func (l *lastN) newestFirst() []Delivery {
	out := make([]Delivery, 0, len(l.ring))
	for i := len(l.ring) - 1; i >= 0; i-- {
		out = append(out, l.ring[(l.next+i)%len(l.ring)])
	}
	return out
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

// Follower reads one agent's deliveries in stream order from a sequence
// on, as fast as its reader asks for them: the batch reads of inbox.fetch,
// woken by the core publish of each delivery (a subscription, no
// consumer). A reader that stops and follows again after the last
// sequence it read misses nothing the stream still holds.
type Follower struct {
	r       *Reader
	agentID string
	after   uint64
	sub     *nats.Subscription
	wake    <-chan struct{}
}

// followPoll is how often a follower with nothing published reads anyway:
// a publish while chime's connection was down wakes no one.
const followPoll = 2 * time.Second

// Follow returns a follower of agentID's deliveries after sequence after.
// Close it when done.
func (r *Reader) Follow(ctx context.Context, agentID string, after uint64) (*Follower, error) {
	nc := r.js.Conn()
	wake := make(chan struct{}, 1)
	// A callback that never blocks: a burst of deliveries is one wake, and
	// never a slow consumer.
	sub, err := nc.Subscribe(subjects.Inbox(agentID), func(*nats.Msg) {
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return nil, fmt.Errorf("deliveries: follow %s: %w", agentID, err)
	}
	// Subscribed at the server before the first read: nothing published
	// after that read can go unnoticed.
	if err := nc.FlushWithContext(ctx); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("deliveries: follow %s: %w", agentID, err)
	}
	return &Follower{r: r, agentID: agentID, after: after, sub: sub, wake: wake}, nil
}

// Next returns the next deliveries, at most max, oldest first, waiting
// until there is one or ctx ends (then its error).
func (f *Follower) Next(ctx context.Context, max int) ([]Delivery, error) {
	// The stream stores what it publishes to subscribers at the same time,
	// not before: after a wake, read again soon until the delivery is there.
	var lag time.Duration
	for {
		list, err := f.r.after(ctx, f.agentID, f.after, max)
		if err != nil {
			return nil, err
		}
		if len(list) > 0 {
			f.after = list[len(list)-1].Seq
			return list, nil
		}
		wait := followPoll
		if lag > 0 {
			wait, lag = lag, min(2*lag, followPoll)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-f.wake:
			lag = storeLag
		case <-t.C:
		}
		t.Stop()
	}
}

// After is the last sequence the follower returned (or started after).
func (f *Follower) After() uint64 { return f.after }

// Close ends the follower's subscription.
func (f *Follower) Close() { _ = f.sub.Unsubscribe() }

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

// SourceScan is how many of an agent's last deliveries RecentFrom looks
// through for the console: a source's deliveries further back are not
// found.
const SourceScan = 10000

// RecentFrom returns the agent's last n deliveries whose envelope's source
// is src (a monitor's events and its ending, a task's result...), newest
// first, from among its last scan deliveries. It reads backwards a
// stretch of sequences at a time, each through its own ephemeral
// consumer, and stops once it has n, has looked at scan of the agent's,
// or has reached the start of the stream; a stretch that would hold more
// of the agent's deliveries than are left to look at is narrowed first
// (a consumer's pending count costs the server no read).
func (r *Reader) RecentFrom(ctx context.Context, agentID string, src subjects.Source, n, scan int) (*Page, error) {
	st, err := r.js.Stream(ctx, r.stream)
	if err != nil {
		return nil, fmt.Errorf("deliveries: stream %s: %w", r.stream, err)
	}
	info := st.CachedInfo()
	first, last := info.State.FirstSeq, info.State.LastSeq
	out := []Delivery{}
	if n <= 0 || scan <= 0 || info.State.Msgs == 0 {
		return &Page{Deliveries: out, LastSeq: last}, nil
	}
	end := last + 1              // what is left to look at is before end
	var above uint64             // the agent's deliveries from end on, as last counted
	window := uint64(fetchBatch) // sequences looked at next
	for end > first && len(out) < n && scan > 0 {
		start := first
		if end-first > window {
			start = end - window
		}
		cons, err := st.CreateConsumer(ctx, ephemeral(agentID, start))
		if err != nil {
			return nil, fmt.Errorf("deliveries: read %s: %w", agentID, err)
		}
		pending := cons.CachedInfo().NumPending
		var here uint64 // the agent's deliveries in [start, end), give or take those stored since above was counted
		if pending > above {
			here = pending - above
		}
		if here > uint64(scan) && window > 1 {
			r.drop(st, cons)
			window = max(1, window/windowGrowth)
			continue
		}
		matched, read, err := fetchFrom(ctx, cons, pending, end, src, n-len(out))
		r.drop(st, cons)
		if err != nil {
			return nil, fmt.Errorf("deliveries: read %s: %w", agentID, err)
		}
		out = append(out, matched...)
		scan -= read
		above, end = pending, start
		if read == 0 || uint64(read) < uint64(scan)/windowGrowth {
			window *= windowGrowth
		}
	}
	return &Page{Deliveries: out, LastSeq: last}, nil
}

// fetchFrom reads cons's messages before sequence end (at most pending)
// and returns the last n of them from src, newest first, and how many it
// read.
func fetchFrom(ctx context.Context, cons jetstream.Consumer, pending, end uint64, src subjects.Source, n int) ([]Delivery, int, error) {
	last := newLastN(n)
	read, done := 0, false
	keep := func(d Delivery) {
		if done || d.Seq >= end {
			done = true
			return
		}
		read++
		var env struct {
			Source subjects.Source `json:"source"`
		}
		if json.Unmarshal(d.Envelope, &env) == nil && env.Source == src {
			last.keep(d)
		}
	}
	for got := uint64(0); got < pending && !done; {
		k, err := fetch(ctx, cons, int(min(pending-got, fetchBatch)), keep)
		if err != nil {
			return nil, read, err
		}
		if k == 0 {
			break
		}
		got += uint64(k)
	}
	return last.newestFirst(), read, nil
}
