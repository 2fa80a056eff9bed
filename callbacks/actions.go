package callbacks

import (
	"context"
	"net/http"

	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/subjects"
)

// Actions are the agent lifecycle's and the triggers' actions, served by s
// (nil: answered unavailable). All are the operator's: an agent does not
// start itself or mint the URLs that reach it.
func (s *Store) Actions() []action.Action {
	h := func(fn action.Handler) action.Handler {
		return action.When(s != nil, "callbacks are not configured", fn)
	}
	return []action.Action{
		{Name: ActionLifecycleStart, Body: "empty or {}", Reply: "{agent_id, status, triggers}", Access: action.Operator, Summary: "start the agent: its callback triggers accept calls",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/start", http.StatusOK, nil), Handle: h(s.serveStart)},
		{Name: ActionLifecycleStop, Body: "empty or {}", Reply: "{agent_id, status, triggers}", Access: action.Operator, Summary: "stop the agent's callbacks: its triggers are revoked (its turn is not interrupted: that is intervention stop)",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/stop", http.StatusOK, nil), Handle: h(s.serveStop)},
		{Name: ActionTriggerCreate, Body: "{delivery_mode?, label?}", Reply: "trigger view with trigger_url", Access: action.Operator, Summary: "create a callback trigger (a URL an external system calls)",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/triggers", http.StatusCreated, nil),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				mode, label, err := DecodeCreateTrigger(r.Body)
				if err != nil {
					return nil, err
				}
				iss, err := s.Create(ctx, r.AgentID, mode, label)
				if err != nil {
					return nil, err
				}
				return iss.View(s.PublicURL()), nil
			})},
		{Name: ActionTriggerCancel, Body: "{external_trigger_id}", Reply: "trigger view", IDField: "external_trigger_id", Access: action.Operator, Summary: "cancel a callback trigger",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/triggers/{trigger_id}/cancel", http.StatusOK,
				action.Path(map[string]string{"external_trigger_id": "trigger_id"})),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				triggerID, err := DecodeTriggerRef(r.Body)
				if err != nil {
					return nil, err
				}
				t, err := s.Revoke(ctx, r.AgentID, triggerID)
				if err != nil {
					return nil, err
				}
				return t.View(), nil
			})},
		{Name: ActionTriggerList, Body: "empty or {}", Reply: "{triggers}", Access: action.Operator, Summary: "list the agent's callback triggers",
			Columns: []string{"external_trigger_id", "status", "delivery_mode", "label", "default", "created_at"},
			HTTP:    action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/triggers", http.StatusOK, action.NoBody),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				if err := subjects.DecodeNoFields(r.Body); err != nil {
					return nil, err
				}
				list, err := s.List(ctx, r.AgentID)
				if err != nil {
					return nil, err
				}
				return map[string]any{"triggers": views(list)}, nil
			})},
		{Name: ActionTriggerReset, Body: "{delivery_mode?}", Reply: "{ok, agent_id, external_trigger_id, trigger_url, delivery_mode, status}", Access: action.Operator, Summary: "replace the agent's default callback trigger and its URL",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/reset-callback", http.StatusOK, nil),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				mode, err := DecodeResetTrigger(r.Body)
				if err != nil {
					return nil, err
				}
				iss, err := s.Reset(ctx, r.AgentID, mode)
				if err != nil {
					return nil, err
				}
				v := iss.View(s.PublicURL())
				return ResetReply{OK: true, AgentID: r.AgentID, TriggerID: v.ID, TriggerURL: v.TriggerURL, Mode: v.Mode, Status: v.Status}, nil
			})},
	}
}

// serveStart serves lifecycle.start. The issued triggers carry their URLs only
// over NATS, where the reply goes to the operator that asked alone.
func (s *Store) serveStart(ctx context.Context, r action.Request) (any, error) {
	if err := subjects.DecodeNoFields(r.Body); err != nil {
		return nil, err
	}
	issued, err := s.Start(ctx, r.AgentID)
	if err != nil {
		return nil, err
	}
	reply := LifecycleReply{AgentID: r.AgentID, Status: agents.AgentActive}
	for i := range issued {
		v := issued[i].Trigger.View()
		if r.Surface == "nats" {
			v = issued[i].View(s.PublicURL())
		}
		reply.Triggers = append(reply.Triggers, v)
	}
	return reply, nil
}

// serveStop serves lifecycle.stop.
func (s *Store) serveStop(ctx context.Context, r action.Request) (any, error) {
	if err := subjects.DecodeNoFields(r.Body); err != nil {
		return nil, err
	}
	list, err := s.Stop(ctx, r.AgentID)
	if err != nil {
		return nil, err
	}
	return LifecycleReply{AgentID: r.AgentID, Status: agents.AgentStopped, Triggers: views(list)}, nil
}

func views(list []Trigger) []TriggerView {
	out := make([]TriggerView, len(list))
	for i := range list {
		out[i] = list[i].View()
	}
	return out
}
