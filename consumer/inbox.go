package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/subjects"
)

// Inbox is the one path by which an envelope reaches an agent's inbox:
// stored in the inbox stream under its stable ID (Nats-Msg-Id), so a
// repeat is stored once. The stream forgets IDs after its dedup window; an
// envelope that may have been stored longer ago than that is looked up in
// the agent's inbox before it is published again (DeliverOnce), so no
// downtime makes a delivery show twice.
//
// Every source of envelopes (timer fires, wait endings, interventions,
// callbacks) stores through here, synchronously with Deliver or, on the
// scheduler's latency path, with DeliverAsync and Stored once acked: this
// is the one place that sees every envelope an agent is given.
type Inbox struct {
	js     jetstream.JetStream
	stream string
	window time.Duration
	now    func() time.Time
	stored *prometheus.CounterVec
	byKind map[string]prometheus.Counter // stored's counters, resolved once: Stored runs per fire

	streamMu sync.Mutex
	streamH  jetstream.Stream // for StoredEnvelope, looked up once
}

// NewInbox returns the inbox path over js: stream is the inbox stream and
// window its dedup window (CHIME_DEDUP_WINDOW).
func NewInbox(js jetstream.JetStream, stream string, window time.Duration, now func() time.Time) *Inbox {
	if now == nil {
		now = time.Now
	}
	i := &Inbox{js: js, stream: stream, window: window, now: now, stored: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "chime_inbox_deliveries_total", Help: "Envelopes stored in agent inboxes by this replica (repeats not counted), by kind.",
	}, []string{"kind"}), byKind: map[string]prometheus.Counter{}}
	for _, k := range []string{subjects.KindTimerFired, subjects.KindWaitComplete, subjects.KindWaitCancelled, subjects.KindIntervention, subjects.KindWakeHint, subjects.KindMessage} {
		i.byKind[k] = i.stored.WithLabelValues(k) // exported before the first delivery too
	}
	return i
}

// Register exports the inbox's metrics.
func (i *Inbox) Register(reg prometheus.Registerer) { reg.MustRegister(i.stored) }

// DeliverAsync publishes an envelope's message (Envelope.Msg, or a
// faster encoding of the same bytes) without waiting; the caller settles
// the future and reports a stored envelope with Stored.
func (i *Inbox) DeliverAsync(m *nats.Msg) (jetstream.PubAckFuture, error) {
	fut, err := i.js.PublishMsgAsync(m)
	if err != nil {
		return nil, fmt.Errorf("deliver %s: %w", m.Header.Get(subjects.HeaderMsgID), err)
	}
	return fut, nil
}

// Stored records that an envelope of kind was acknowledged by the stream.
func (i *Inbox) Stored(kind string, ack *jetstream.PubAck) {
	if ack.Duplicate {
		return
	}
	if c, ok := i.byKind[kind]; ok {
		c.Inc()
		return
	}
	i.stored.WithLabelValues(kind).Inc()
}

// headerRoom is what a message keeps free of the server's max payload for
// its headers.
const headerRoom = 1024

// Room is how many bytes an envelope may take and still be delivered:
// requests refuse, with payload_too_large, what would not fit, rather than
// store something no inbox will take.
func (i *Inbox) Room() int64 { return i.js.Conn().MaxPayload() - headerRoom }

// Deliver stores env in its agent's inbox and returns the stream's ack
// (Duplicate when the envelope was stored within the dedup window). An
// envelope larger than the server takes is ErrPoison: it never will fit
// (a smaller max payload since it was accepted), and retrying is futile.
func (i *Inbox) Deliver(ctx context.Context, env *subjects.Envelope) (*jetstream.PubAck, error) {
	m, err := env.Msg()
	if err != nil {
		return nil, err
	}
	ack, err := Publish(ctx, i.js, m)
	if errors.Is(err, nats.ErrMaxPayload) {
		return nil, fmt.Errorf("deliver %s: %w: %w", env.ID, ErrPoison, err)
	}
	if err != nil {
		return nil, fmt.Errorf("deliver %s: %w", env.ID, err)
	}
	i.Stored(env.Kind, ack)
	return ack, nil
}

// DeliverOnce is Deliver for an envelope that may have been stored already
// at or after since (the occurrence's own time): when that is older than
// the dedup window covers, the inbox is searched first, and a found
// envelope is reported as a duplicate without publishing.
func (i *Inbox) DeliverOnce(ctx context.Context, env *subjects.Envelope, since time.Time) (*jetstream.PubAck, error) {
	if i.Suspect(since) {
		seen, err := i.Delivered(ctx, env.AgentID, since)
		if err != nil {
			return nil, err
		}
		if seq, ok := seen[env.ID]; ok {
			return &jetstream.PubAck{Stream: i.stream, Sequence: seq, Duplicate: true}, nil
		}
	}
	return i.Deliver(ctx, env)
}

// Suspect reports whether an envelope first sent at or after since may
// have been stored longer ago than the dedup window remembers. A tenth of
// the window is kept as margin for clocks and slow acks.
func (i *Inbox) Suspect(since time.Time) bool {
	return i.now().Sub(since) > i.window-i.window/10
}

// Delivered returns the IDs of the envelopes stored in the agent's inbox
// at or after since (less a minute for clocks), each with its stream
// sequence, reading headers only.
func (i *Inbox) Delivered(ctx context.Context, agentID string, since time.Time) (map[string]uint64, error) {
	start := since.Add(-time.Minute)
	cons, err := i.js.CreateConsumer(ctx, i.stream, jetstream.ConsumerConfig{
		FilterSubject: subjects.Inbox(agentID), DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &start,
		AckPolicy: jetstream.AckNonePolicy, HeadersOnly: true, MemoryStorage: true, Replicas: 1, InactiveThreshold: time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("inbox search %s: %w", agentID, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = i.js.DeleteConsumer(dctx, i.stream, cons.CachedInfo().Name)
	}()
	seen := map[string]uint64{}
	// A fetch of more than is pending would wait out its expiry: ask for
	// what is left, as each message's metadata tells.
	for left := cons.CachedInfo().NumPending; left > 0; {
		batch, err := cons.Fetch(int(min(left, 1024)), jetstream.FetchContext(ctx))
		if err != nil {
			return nil, fmt.Errorf("inbox search %s: %w", agentID, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				return nil, fmt.Errorf("inbox search %s: %w", agentID, err)
			}
			seen[m.Headers().Get(jetstream.MsgIDHeader)] = md.Sequence.Stream
			left = md.NumPending
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, fmt.Errorf("inbox search %s: %w", agentID, err)
		}
		if got == 0 {
			return nil, fmt.Errorf("inbox search %s: no progress", agentID)
		}
	}
	return seen, nil
}

// StoredEnvelope reads the envelope the inbox stream holds at seq: for a
// publish acknowledged as a duplicate, the ack's sequence is the stored
// original's.
func (i *Inbox) StoredEnvelope(ctx context.Context, seq uint64) (*subjects.Envelope, error) {
	i.streamMu.Lock()
	st := i.streamH
	i.streamMu.Unlock()
	if st == nil {
		var err error
		if st, err = i.js.Stream(ctx, i.stream); err != nil {
			return nil, fmt.Errorf("inbox read %d: %w", seq, err)
		}
		i.streamMu.Lock()
		i.streamH = st
		i.streamMu.Unlock()
	}
	m, err := st.GetMsg(ctx, seq)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			i.streamMu.Lock()
			i.streamH = nil // re-created: look it up again
			i.streamMu.Unlock()
		}
		return nil, fmt.Errorf("inbox read %d: %w", seq, err)
	}
	var env subjects.Envelope
	if err := json.Unmarshal(m.Data, &env); err != nil {
		return nil, fmt.Errorf("inbox read %d: %w", seq, err)
	}
	return &env, nil
}
