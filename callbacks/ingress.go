package callbacks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/subjects"
)

// Service accepts callbacks.
type Service struct {
	store       *Store
	inbox       *consumer.Inbox
	js          jetstream.JetStream
	inboxStream string
	now         func() time.Time
	log         *slog.Logger
}

// NewService returns the callback ingress over store; inbox says how large
// a delivery may be. inboxStream is the stream of agent inboxes, where an
// agent's inbox consumer tells whether it has taken its wake hint.
func NewService(store *Store, inbox *consumer.Inbox, js jetstream.JetStream, inboxStream string, now func() time.Time, log *slog.Logger) *Service {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{store: store, inbox: inbox, js: js, inboxStream: inboxStream, now: now, log: log.With("component", "callbacks")}
}

// Request is one callback as it arrived, over HTTP or NATS.
type Request struct {
	Mode           DeliveryMode
	Token          string
	ContentType    string
	IdempotencyKey string
	Body           []byte
}

// Accept accepts a callback: the token must name an active trigger of
// the route's mode whose agent is active; the body must decode. It returns
// only once the event is stored. The token goes no further than the
// lookup: not into the event, a log line, a subject or a label.
func (o *Service) Accept(ctx context.Context, req Request) (*CallbackReply, error) {
	t, err := o.store.Resolve(req.Token, req.Mode)
	if err != nil {
		return nil, err
	}
	if err := o.confirm(ctx, t); err != nil {
		return nil, err
	}
	payload, err := DecodeCallbackBody(req.ContentType, req.Body)
	if err != nil {
		return nil, err
	}
	reply := func(disposition string) *CallbackReply {
		return &CallbackReply{OK: true, Result: CallbackResult{
			AgentID: t.AgentID, TriggerID: t.ID, Mode: t.Mode, Disposition: disposition,
		}}
	}
	// A retry of a stored callback is answered before anything else, so it
	// never claims, or folds into, a wake.
	idem := ""
	if req.IdempotencyKey != "" {
		idem = CallbackMsgID(t.ID, req.IdempotencyKey, "")
		seen, err := o.store.Seen(ctx, idem)
		if err != nil {
			return nil, err
		}
		if seen {
			return reply(DispositionDuplicate), nil
		}
	}
	ev := CallbackEvent{
		ID: "cb_" + nuid.Next(), AgentID: t.AgentID, TriggerID: t.ID, Mode: t.Mode,
		Disposition: t.Mode.Accepted(), At: o.now().UTC(), Payload: payload,
	}
	// Too big to deliver is refused now, not found undeliverable later. The
	// envelope carries the payload at least once, so it bounds the event too.
	env := CallbackEnvelope(&ev)
	envMsg, err := env.Msg()
	if err != nil {
		return nil, fmt.Errorf("callbacks: encode callback: %w", err)
	}
	if int64(len(envMsg.Data)) > o.inbox.Room() {
		return nil, &subjects.Error{Code: subjects.CodePayloadTooLarge, Message: "callback body too large once encoded for delivery"}
	}
	claimed := false
	if t.Mode == ModeWakeHint {
		if ev.Disposition, ev.CoalescedInto, ev.FloorAtFold, claimed, err = o.claimWake(ctx, t.AgentID, ev.ID); err != nil {
			return nil, err
		}
	}
	data, err := subjects.EncodeJSON(ev)
	if err != nil {
		return nil, fmt.Errorf("callbacks: encode callback: %w", err)
	}
	m := &nats.Msg{Subject: t.Mode.EventSubject(), Data: data, Header: nats.Header{}}
	msgID := idem
	if msgID == "" {
		msgID = CallbackMsgID(t.ID, "", ev.ID)
	}
	m.Header.Set(jetstream.MsgIDHeader, msgID)
	ack, err := o.js.PublishMsg(ctx, m)
	if err != nil || ack.Duplicate {
		// Not stored by this request: give the pending slot back, or the
		// next wakes would fold into a hint that never comes.
		if claimed {
			o.releaseWake(ctx, t.AgentID, ev.ID)
		}
		if err != nil {
			return nil, fmt.Errorf("callbacks: store callback: %w", err)
		}
		return reply(DispositionDuplicate), nil
	}
	if idem != "" {
		if err := o.store.Remember(ctx, idem); err != nil {
			// Stored already; the stream's own dedup still covers retries
			// for its window.
			o.log.Warn("remember idempotency key", "agent_id", t.AgentID, "err", err)
		}
	}
	return reply(ev.Disposition), nil
}

// claimWake decides whether a wake is delivered or coalesced into the
// hint the agent has not consumed yet. Only an agent that reads its inbox
// reliably can have one pending: through chime (its cursor, inbox.ack), or
// where NATS authorization is off through an inbox consumer of its own
// (its ack floor); for the others nothing is written. For them, claimed
// reports whether this wake took the pending slot (by CAS on the agent's
// record); a coalesced wake names the pending hint it folded into and the
// ack floor it saw (see subjects.CallbackEvent).
func (o *Service) claimWake(ctx context.Context, agentID, eventID string) (disposition, into string, ackFloor uint64, claimed bool, err error) {
	c, err := o.js.Consumer(ctx, o.inboxStream, agents.InboxConsumer(agentID))
	consumer := err == nil
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return "", "", 0, false, fmt.Errorf("callbacks: inbox consumer: %w", err)
	}
	if consumer {
		ackFloor = c.CachedInfo().AckFloor.Stream
	}
	landed := map[string]uint64{}
	reads := true
	_, err = o.store.UpdateAgent(ctx, agentID, func(st *agents.AgentState) (bool, error) {
		if !consumer {
			if reads = st.InboxAcked > 0; !reads {
				return false, nil
			}
			ackFloor = st.InboxAcked
		}
		pw := st.PendingWake
		if pw != nil && pw.InboxSeq == 0 {
			// The hint may be in the inbox, even taken, before chime has
			// written down where it landed: look, rather than fold a wake
			// into a hint the agent already has.
			seq, ok := landed[pw.EventID]
			if !ok {
				seq = o.landedAt(ctx, agentID, pw.EventID)
				landed[pw.EventID] = seq
			}
			if seq != 0 {
				cp := *pw
				cp.InboxSeq = seq
				pw = &cp
			}
		}
		if pw != nil && !WakeConsumed(pw, ackFloor, o.now()) {
			disposition, into, claimed = DispositionCoalesced, pw.EventID, false
			return false, nil
		}
		disposition, into, claimed = DispositionTriggered, "", true
		st.PendingWake = &agents.PendingWake{EventID: eventID, ClaimedAt: o.now().UTC()}
		return true, nil
	})
	if err == nil && !reads {
		return DispositionTriggered, "", 0, false, nil
	}
	return disposition, into, ackFloor, claimed, err
}

// confirm reads the trigger's record from its stream's leader, so that a
// revoke acknowledged anywhere refuses the token here at once, whatever
// this replica's index has seen yet: the index turns away bad tokens
// without a round trip, this one read stands behind every accepted one.
// (A KV get may be answered by a follower that lags a revoke; the
// stream's message API is answered by the leader.)
func (o *Service) confirm(ctx context.Context, t *Trigger) error {
	last, err := kvrec.LeaderLast(ctx, o.js.Conn(), o.store.triggers.Bucket(), recKey(t.AgentID, t.ID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return ErrCallbackRejected // the record is gone
	}
	if err != nil {
		return fmt.Errorf("callbacks: confirm trigger: %w", err)
	}
	var rec Trigger
	if json.Unmarshal(last.Data, &rec) != nil || !usable(&rec, t.TokenHash, t.Mode) {
		return ErrCallbackRejected
	}
	return nil
}

// landedAt returns the inbox sequence of the wake hint of eventID when it
// is the agent's latest delivery, or 0: a cheap look that covers the usual
// race (the agent took the hint before chime recorded its sequence).
func (o *Service) landedAt(ctx context.Context, agentID, eventID string) uint64 {
	stream, err := o.js.Stream(ctx, o.inboxStream)
	if err != nil {
		return 0
	}
	m, err := stream.GetLastMsgForSubject(ctx, subjects.Inbox(agentID))
	if err != nil || m.Header.Get(jetstream.MsgIDHeader) != WakeHintID(eventID) {
		return 0
	}
	return m.Sequence
}

// releaseWake drops a claim whose event turned out to be a duplicate.
func (o *Service) releaseWake(ctx context.Context, agentID, eventID string) {
	if _, err := o.store.UpdateAgent(ctx, agentID, func(st *agents.AgentState) (bool, error) {
		if st.PendingWake == nil || st.PendingWake.EventID != eventID || st.PendingWake.InboxSeq != 0 {
			return false, nil
		}
		st.PendingWake = nil
		return true, nil
	}); err != nil {
		o.log.Warn("release wake claim", "agent_id", agentID, "err", err)
	}
}
