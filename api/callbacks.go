package api

import (
	"context"
	"encoding/json"
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
	ev := subjects.CallbackEvent{
		ID: "cb_" + nuid.Next(), AgentID: t.AgentID, TriggerID: t.ID, Mode: t.Mode,
		Disposition: subjects.DispositionDelivered, At: o.now().UTC(), Payload: payload,
	}
	claimed := false
	if t.Mode == subjects.ModeWakeHint {
		if ev.Disposition, err = o.claimWake(ctx, t.AgentID, ev.ID); err != nil {
			return nil, err
		}
		claimed = ev.Disposition == subjects.DispositionDelivered
	}
	data, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("api: encode callback: %w", err)
	}
	m := &nats.Msg{Subject: t.Mode.EventSubject(), Data: data, Header: nats.Header{}}
	m.Header.Set(jetstream.MsgIDHeader, subjects.CallbackMsgID(t.ID, req.IdempotencyKey, ev.ID))
	ack, err := o.js.PublishMsg(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("api: store callback: %w", err)
	}
	if ack.Duplicate {
		ev.Disposition = subjects.DispositionDuplicate
		if claimed {
			o.releaseWake(ctx, t.AgentID, ev.ID)
		}
	}
	return &subjects.CallbackReply{OK: true, Result: subjects.CallbackResult{
		AgentID: t.AgentID, TriggerID: t.ID, Mode: t.Mode, Disposition: ev.Disposition,
	}}, nil
}

// claimWake decides, by CAS on the agent's record, whether a wake is
// delivered (it becomes the pending hint) or coalesced into the hint the
// agent has not consumed yet.
func (o *Operations) claimWake(ctx context.Context, agentID, eventID string) (string, error) {
	disposition := subjects.DispositionDelivered
	_, err := o.triggers.UpdateAgent(ctx, agentID, func(st *subjects.AgentState) (bool, error) {
		if pw := st.PendingWake; pw != nil {
			consumed, err := o.wakeConsumed(ctx, agentID, pw)
			if err != nil {
				return false, err
			}
			if !consumed {
				disposition = subjects.DispositionCoalesced
				return false, nil
			}
		}
		disposition = subjects.DispositionDelivered
		st.PendingWake = &subjects.PendingWake{EventID: eventID, ClaimedAt: o.now().UTC()}
		return true, nil
	})
	return disposition, err
}

// wakeConsumed reports whether the agent has acked the pending hint on its
// inbox consumer (subjects.InboxConsumer). An agent without that consumer
// has nothing held back; with it, a hint still in flight to the inbox is
// pending until its claim goes stale.
func (o *Operations) wakeConsumed(ctx context.Context, agentID string, pw *subjects.PendingWake) (bool, error) {
	c, err := o.js.Consumer(ctx, o.inboxStream, subjects.InboxConsumer(agentID))
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("api: inbox consumer: %w", err)
	}
	if pw.InboxSeq == 0 {
		return o.now().Sub(pw.ClaimedAt) > subjects.StaleClaim, nil
	}
	return c.CachedInfo().AckFloor.Stream >= pw.InboxSeq, nil
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
