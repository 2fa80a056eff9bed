package api

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/chime-nats/chime/subjects"
)

// lifecycle runs the agent lifecycle and trigger actions. Start's reply
// carries the new triggers' URLs only over NATS: there it is the reply to
// the agent's own request; an operator over HTTP gets the IDs and uses
// reset-callback for a URL.
func (o *Operations) lifecycle(ctx context.Context, surface, action, agentID string, body []byte) (any, error) {
	if o.triggers == nil {
		return nil, &subjects.Error{Code: subjects.CodeUnavailable, Message: "callbacks are not configured"}
	}
	switch action {
	case subjects.ActionLifecycleStart, subjects.ActionLifecycleStop:
		if err := subjects.DecodeStrict(body, &struct{}{}); err != nil {
			return nil, err
		}
		if action == subjects.ActionLifecycleStop {
			list, err := o.triggers.Stop(ctx, agentID)
			if err != nil {
				return nil, err
			}
			return subjects.LifecycleReply{AgentID: agentID, Status: subjects.AgentStopped, Triggers: views(list)}, nil
		}
		issued, err := o.triggers.Start(ctx, agentID)
		if err != nil {
			return nil, err
		}
		reply := subjects.LifecycleReply{AgentID: agentID, Status: subjects.AgentActive}
		for i := range issued {
			v := issued[i].Trigger.View()
			if surface == "nats" {
				v = issued[i].View(o.triggers.PublicURL())
			}
			reply.Triggers = append(reply.Triggers, v)
		}
		return reply, nil
	case subjects.ActionTriggerCreate:
		var req subjects.CreateTriggerRequest
		if err := subjects.DecodeStrict(body, &req); err != nil {
			return nil, err
		}
		mode, err := req.Validate()
		if err != nil {
			return nil, err
		}
		iss, err := o.triggers.Create(ctx, agentID, mode, req.Label)
		if err != nil {
			return nil, err
		}
		return iss.View(o.triggers.PublicURL()), nil
	case subjects.ActionTriggerReset:
		var req subjects.ResetTriggerRequest
		if err := subjects.DecodeStrict(body, &req); err != nil {
			return nil, err
		}
		mode, err := subjects.ParseMode(req.Mode, subjects.ModeWakeHint)
		if err != nil {
			return nil, err
		}
		iss, err := o.triggers.Reset(ctx, agentID, mode)
		if err != nil {
			return nil, err
		}
		v := iss.View(o.triggers.PublicURL())
		return subjects.ResetReply{OK: true, AgentID: agentID, TriggerID: v.ID, TriggerURL: v.TriggerURL, Mode: v.Mode, Status: v.Status}, nil
	case subjects.ActionTriggerCancel:
		var req subjects.TriggerRef
		if err := subjects.DecodeStrict(body, &req); err != nil {
			return nil, err
		}
		if err := req.Validate(); err != nil {
			return nil, err
		}
		t, err := o.triggers.Revoke(ctx, agentID, req.ID)
		if err != nil {
			return nil, err
		}
		return t.View(), nil
	case subjects.ActionTriggerList:
		if err := subjects.DecodeStrict(body, &struct{}{}); err != nil {
			return nil, err
		}
		list, err := o.triggers.List(ctx, agentID)
		if err != nil {
			return nil, err
		}
		return map[string]any{"triggers": views(list)}, nil
	}
	return nil, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: fmt.Sprintf("unknown action %q", action)}
}

func views(list []subjects.Trigger) []subjects.TriggerView {
	out := make([]subjects.TriggerView, len(list))
	for i := range list {
		out[i] = list[i].View()
	}
	return out
}

// CallbackRequest is one callback as it arrived, over HTTP or NATS.
type CallbackRequest struct {
	Mode           subjects.DeliveryMode
	Token          string
	ContentType    string
	IdempotencyKey string
	Body           []byte
}

// Callback accepts a callback: the token must name an active trigger of
// the route's mode whose agent is active; the body must decode. The reply
// comes only once the event is stored. The token goes no further than
// the lookup: not into the event, a log line, a subject or a label.
func (o *Operations) Callback(ctx context.Context, surface string, req CallbackRequest) (*subjects.CallbackReply, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	reply, err := o.callback(ctx, req)
	outcome := "ok"
	if err != nil {
		e := subjects.AsError(err)
		outcome = e.Code
		if e.Code == subjects.CodeInternal {
			o.log.Error("callback failed", "surface", surface, "mode", string(req.Mode), "err", err)
		}
		err = e
	}
	o.requests.WithLabelValues(surface+":callback."+req.Mode.Route(), outcome).Inc()
	return reply, err
}

func (o *Operations) callback(ctx context.Context, req CallbackRequest) (*subjects.CallbackReply, error) {
	if o.triggers == nil {
		return nil, subjects.ErrCallbackRejected
	}
	t, err := o.triggers.Resolve(req.Token, req.Mode)
	if err != nil {
		return nil, err
	}
	payload, err := subjects.DecodeCallbackBody(req.ContentType, req.Body)
	if err != nil {
		return nil, err
	}
	reply := func(disposition string) *subjects.CallbackReply {
		return &subjects.CallbackReply{OK: true, Result: subjects.CallbackResult{
			AgentID: t.AgentID, TriggerID: t.ID, Mode: t.Mode, Disposition: disposition,
		}}
	}
	// A retry of a stored callback is answered before anything else, so it
	// never claims, or folds into, a wake.
	idem := ""
	if req.IdempotencyKey != "" {
		idem = subjects.CallbackMsgID(t.ID, req.IdempotencyKey, "")
		seen, err := o.triggers.Seen(ctx, idem)
		if err != nil {
			return nil, err
		}
		if seen {
			return reply(subjects.DispositionDuplicate), nil
		}
	}
	ev := subjects.CallbackEvent{
		ID: "cb_" + nuid.Next(), AgentID: t.AgentID, TriggerID: t.ID, Mode: t.Mode,
		Disposition: subjects.DispositionDelivered, At: o.now().UTC(), Payload: payload,
	}
	// Too big to deliver is refused now, not found undeliverable later. The
	// envelope carries the payload at least once, so it bounds the event too.
	env := subjects.CallbackEnvelope(&ev)
	envMsg, err := env.Msg()
	if err != nil {
		return nil, fmt.Errorf("api: encode callback: %w", err)
	}
	if int64(len(envMsg.Data)+1024) > o.js.Conn().MaxPayload() {
		return nil, &subjects.Error{Code: subjects.CodePayloadTooLarge, Message: "callback body too large once encoded for delivery"}
	}
	claimed := false
	if t.Mode == subjects.ModeWakeHint {
		if ev.Disposition, ev.CoalescedInto, ev.FloorAtFold, claimed, err = o.claimWake(ctx, t.AgentID, ev.ID); err != nil {
			return nil, err
		}
	}
	data, err := subjects.EncodeJSON(ev)
	if err != nil {
		return nil, fmt.Errorf("api: encode callback: %w", err)
	}
	m := &nats.Msg{Subject: t.Mode.EventSubject(), Data: data, Header: nats.Header{}}
	msgID := idem
	if msgID == "" {
		msgID = subjects.CallbackMsgID(t.ID, "", ev.ID)
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
			return nil, fmt.Errorf("api: store callback: %w", err)
		}
		return reply(subjects.DispositionDuplicate), nil
	}
	if idem != "" {
		if err := o.triggers.Remember(ctx, idem); err != nil {
			// Stored already; the stream's own dedup still covers retries
			// for its window.
			o.log.Warn("remember idempotency key", "agent_id", t.AgentID, "err", err)
		}
	}
	return reply(ev.Disposition), nil
}

// claimWake decides whether a wake is delivered or coalesced into the
// hint the agent has not consumed yet. Only an agent with an inbox
// consumer can have one pending; for the others nothing is written. For
// them, claimed reports whether this wake took the pending slot (by CAS on
// the agent's record); a coalesced wake names the pending hint it folded
// into and the ack floor it saw (see subjects.CallbackEvent).
func (o *Operations) claimWake(ctx context.Context, agentID, eventID string) (disposition, into string, ackFloor uint64, claimed bool, err error) {
	c, err := o.js.Consumer(ctx, o.inboxStream, subjects.InboxConsumer(agentID))
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return subjects.DispositionDelivered, "", 0, false, nil
	}
	if err != nil {
		return "", "", 0, false, fmt.Errorf("api: inbox consumer: %w", err)
	}
	ackFloor = c.CachedInfo().AckFloor.Stream
	_, err = o.triggers.UpdateAgent(ctx, agentID, func(st *subjects.AgentState) (bool, error) {
		if pw := st.PendingWake; pw != nil && !subjects.WakeConsumed(pw, ackFloor, o.now()) {
			disposition, into, claimed = subjects.DispositionCoalesced, pw.EventID, false
			return false, nil
		}
		disposition, into, claimed = subjects.DispositionDelivered, "", true
		st.PendingWake = &subjects.PendingWake{EventID: eventID, ClaimedAt: o.now().UTC()}
		return true, nil
	})
	return disposition, into, ackFloor, claimed, err
}

// releaseWake drops a claim whose event turned out to be a duplicate.
func (o *Operations) releaseWake(ctx context.Context, agentID, eventID string) {
	if _, err := o.triggers.UpdateAgent(ctx, agentID, func(st *subjects.AgentState) (bool, error) {
		if st.PendingWake == nil || st.PendingWake.EventID != eventID || st.PendingWake.InboxSeq != 0 {
			return false, nil
		}
		st.PendingWake = nil
		return true, nil
	}); err != nil {
		o.log.Warn("release wake claim", "agent_id", agentID, "err", err)
	}
}
