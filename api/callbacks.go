package api

import (
	"context"
	"fmt"

	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/callbacks"
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
	case callbacks.ActionLifecycleStart, callbacks.ActionLifecycleStop:
		if err := subjects.DecodeNoFields(body); err != nil {
			return nil, err
		}
		if action == callbacks.ActionLifecycleStop {
			list, err := o.triggers.Stop(ctx, agentID)
			if err != nil {
				return nil, err
			}
			return callbacks.LifecycleReply{AgentID: agentID, Status: agents.AgentStopped, Triggers: views(list)}, nil
		}
		issued, err := o.triggers.Start(ctx, agentID)
		if err != nil {
			return nil, err
		}
		reply := callbacks.LifecycleReply{AgentID: agentID, Status: agents.AgentActive}
		for i := range issued {
			v := issued[i].Trigger.View()
			if surface == "nats" {
				v = issued[i].View(o.triggers.PublicURL())
			}
			reply.Triggers = append(reply.Triggers, v)
		}
		return reply, nil
	case callbacks.ActionTriggerCreate:
		mode, label, err := callbacks.DecodeCreateTrigger(body)
		if err != nil {
			return nil, err
		}
		iss, err := o.triggers.Create(ctx, agentID, mode, label)
		if err != nil {
			return nil, err
		}
		return iss.View(o.triggers.PublicURL()), nil
	case callbacks.ActionTriggerReset:
		mode, err := callbacks.DecodeResetTrigger(body)
		if err != nil {
			return nil, err
		}
		iss, err := o.triggers.Reset(ctx, agentID, mode)
		if err != nil {
			return nil, err
		}
		v := iss.View(o.triggers.PublicURL())
		return callbacks.ResetReply{OK: true, AgentID: agentID, TriggerID: v.ID, TriggerURL: v.TriggerURL, Mode: v.Mode, Status: v.Status}, nil
	case callbacks.ActionTriggerCancel:
		triggerID, err := callbacks.DecodeTriggerRef(body)
		if err != nil {
			return nil, err
		}
		t, err := o.triggers.Revoke(ctx, agentID, triggerID)
		if err != nil {
			return nil, err
		}
		return t.View(), nil
	case callbacks.ActionTriggerList:
		if err := subjects.DecodeNoFields(body); err != nil {
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

func views(list []callbacks.Trigger) []callbacks.TriggerView {
	out := make([]callbacks.TriggerView, len(list))
	for i := range list {
		out[i] = list[i].View()
	}
	return out
}

// Callback accepts a callback (see callbacks.Service.Accept), bounded by
// the request timeout and counted; a body over the callback limit is
// refused first, on NATS as on HTTP. The token goes no further than the
// lookup: not into a log line, a subject or a label.
func (o *Operations) Callback(ctx context.Context, surface string, req callbacks.Request) (*callbacks.CallbackReply, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var reply *callbacks.CallbackReply
	err := o.checkBody(callbackAction, len(req.Body))
	switch {
	case err != nil:
	case o.callbacks == nil:
		err = callbacks.ErrCallbackRejected
	default:
		reply, err = o.callbacks.Accept(ctx, req)
	}
	err = o.finish(surface+":callback."+req.Mode.Route(), "callback", err, "surface", surface, "mode", string(req.Mode))
	return reply, err
}
