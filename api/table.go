package api

import (
	"context"
	"net/http"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/interventions"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/waits"
)

// features are the actions of every feature, in the order the service
// lists them. Adding a feature's actions is one line here.
func (o *Operations) features() [][]action.Action {
	return [][]action.Action{
		o.store.Actions(o.quotas),
		o.waitActions(),
		o.lifecycleActions(),
		o.tokens.Actions(),
		o.waitFor.Actions(o.quotas),
		o.questions.Actions(o.quotas),
		o.tasks.Actions(),
		o.notifications.Actions(o.quotas),
		o.inbox.Actions(),
	}
}

func (o *Operations) waitActions() []action.Action {
	return []action.Action{
		{Name: waits.ActionWaitRequest, Access: action.Agent, Summary: "wait for a duration or until a time; the end is delivered to the inbox",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/waits", http.StatusCreated, nil), Handle: o.requestWait},
		{Name: waits.ActionWaitCancel, IDField: "wait_id", Access: action.Agent, Summary: "cancel a managed wait",
			HTTP:   action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/waits/{wait_id}/cancel", http.StatusOK, action.Path(map[string]string{"wait_id": "wait_id"})),
			Handle: o.cancelWait},
		{Name: waits.ActionWaitList, Access: action.Agent, Summary: "list the agent's managed waits and WaitFor registrations",
			Columns: []string{"wait_id", "status", "mode", "target_time", "wake", "resource", "reason", "work_item_id"},
			HTTP:    action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/waits", http.StatusOK, action.List),
			Handle:  func(ctx context.Context, r action.Request) (any, error) { return o.waitList(ctx, r.AgentID, r.Body) }},
		{Name: waits.ActionIntervention, Command: "intervene", Access: action.Operator, Summary: "message, pause, resume or stop an agent: in-flight waits end",
			MaxBody: o.interventionLimit,
			HTTP:    action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/intervention", http.StatusOK, nil), Handle: o.intervene},
	}
}

func (o *Operations) lifecycleActions() []action.Action {
	h := func(name string) action.Handler {
		return func(ctx context.Context, r action.Request) (any, error) {
			return o.lifecycle(ctx, r.Surface, name, r.AgentID, r.Body)
		}
	}
	return []action.Action{
		{Name: callbacks.ActionLifecycleStart, Access: action.Operator, Summary: "start the agent: its callback triggers accept calls",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/start", http.StatusOK, nil), Handle: h(callbacks.ActionLifecycleStart)},
		{Name: callbacks.ActionLifecycleStop, Access: action.Operator, Summary: "stop the agent: its callback triggers are revoked",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/stop", http.StatusOK, nil), Handle: h(callbacks.ActionLifecycleStop)},
		{Name: callbacks.ActionTriggerCreate, Access: action.Operator, Summary: "create a callback trigger (a URL an external system calls)",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/triggers", http.StatusCreated, nil), Handle: h(callbacks.ActionTriggerCreate)},
		{Name: callbacks.ActionTriggerCancel, IDField: "external_trigger_id", Access: action.Operator, Summary: "cancel a callback trigger",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/triggers/{trigger_id}/cancel", http.StatusOK,
				action.Path(map[string]string{"external_trigger_id": "trigger_id"})), Handle: h(callbacks.ActionTriggerCancel)},
		{Name: callbacks.ActionTriggerList, Access: action.Operator, Summary: "list the agent's callback triggers",
			Columns: []string{"external_trigger_id", "status", "delivery_mode", "label", "default", "created_at"},
			HTTP:    action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/triggers", http.StatusOK, action.NoBody), Handle: h(callbacks.ActionTriggerList)},
		{Name: callbacks.ActionTriggerReset, Access: action.Operator, Summary: "replace the agent's default callback trigger and its URL",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/reset-callback", http.StatusOK, nil), Handle: h(callbacks.ActionTriggerReset)},
	}
}

// requestWait serves wait.request.
func (o *Operations) requestWait(ctx context.Context, r action.Request) (any, error) {
	spec, err := waits.DecodeWaitRequest(r.Body, o.now(), o.tz)
	if err != nil {
		return nil, err
	}
	if !action.Replayed(ctx, o.waits.Get, r.AgentID, spec.Request.RequestID, subjects.WaitIDFor) {
		if err := o.quotas.Wait(ctx, r.AgentID); err != nil {
			return nil, err
		}
	}
	w, err := o.waits.Create(ctx, r.AgentID, spec)
	if err != nil {
		return nil, err
	}
	return waits.WaitReply{WaitID: w.ID, TargetTime: subjects.FormatISO(w.Target()), Mode: w.Mode}, nil
}

// cancelWait serves wait.cancel.
func (o *Operations) cancelWait(ctx context.Context, r action.Request) (any, error) {
	waitID, err := waits.DecodeWaitRef(r.Body)
	if err != nil {
		return nil, err
	}
	return o.waitOps.Cancel(ctx, r.AgentID, waitID)
}

// intervene serves intervention.
func (o *Operations) intervene(ctx context.Context, r action.Request) (any, error) {
	req, err := interventions.DecodeIntervention(r.Body)
	if err != nil {
		return nil, err
	}
	return o.waitOps.Intervene(ctx, r.AgentID, req)
}

// interventionLimit: an intervention's text may be as long as its
// deliveries can carry, which Intervene checks against the inbox; its
// body is bounded by the most that could still decode to such a text
// (every byte escaped as \uXXXX: six to one), so that HTTP, where no
// server's max payload bounds it, never reads more.
func (o *Operations) interventionLimit() int64 {
	if o.waitOps == nil {
		return subjects.MaxRequestBody
	}
	return 6*o.waitOps.Room() + subjects.MaxRequestBody
}

// Rights are what principals may request over NATS, from the action table
// (which needs no storage to be read).
func Rights() access.Rights { return access.RightsOf(NewOperations(Config{}).table) }
