package waits

import (
	"context"
	"net/http"

	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/interventions"
	"github.com/chime-nats/chime/quotas"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/waitfor"
)

// Actions are the managed waits' actions and the intervention, served by
// o (nil: answered unavailable) under q's limits. wait.list pages wf's
// WaitFor registrations too (nil: none); tz is the zone of an until
// without an offset (CHIME_TIMEZONE, empty: UTC).
func (o *Requests) Actions(q *quotas.Quotas, wf *waitfor.Service, tz string) []action.Action {
	h := func(fn action.Handler) action.Handler { return action.When(o != nil, "waits are not configured", fn) }
	return []action.Action{
		{Name: ActionWaitRequest, Tool: &action.Tool{Name: "wait", Prompt: "wait.md", Later: later{o}}, Body: "{seconds?, minutes?, hours?, days?} or {until}; tz?, id?, request_id?", Reply: "{wait_id, target_time, mode}", Access: action.Agent, Summary: "wait for a duration or until a time; the end is delivered to the inbox",
			HTTP:   action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/waits", http.StatusCreated, nil),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) { return o.request(ctx, q, tz, r) })},
		{Name: ActionWaitCancel, Body: "{wait_id}", Reply: "wait record", IDField: "wait_id", Access: action.Agent, Summary: "cancel a managed wait",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/waits/{wait_id}/cancel", http.StatusOK, action.Path(map[string]string{"wait_id": "wait_id"})),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				waitID, err := DecodeWaitRef(r.Body)
				if err != nil {
					return nil, err
				}
				return o.Cancel(ctx, r.AgentID, waitID)
			})},
		{Name: ActionWaitList, Body: "{limit?, cursor?}", Reply: "{waits, wait_for, next_cursor}", Access: action.Agent, Summary: "list the agent's managed waits and WaitFor registrations",
			Columns: []string{"wait_id", "status", "mode", "target_time", "wake", "resource", "reason", "work_item_id"},
			HTTP:    action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/waits", http.StatusOK, action.List),
			Handle:  h(func(ctx context.Context, r action.Request) (any, error) { return o.list(ctx, wf, r) })},
		{Name: ActionIntervention, Body: "{action, text?}", Reply: "{ok, intervention_id}", Command: "intervene", Access: action.Operator, Summary: "message, pause, resume or stop an agent's turn (an interruption; its callbacks go on): in-flight waits end",
			MaxBody: o.interventionLimit,
			HTTP:    action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/intervention", http.StatusOK, nil),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				req, err := interventions.DecodeIntervention(r.Body)
				if err != nil {
					return nil, err
				}
				return o.Intervene(ctx, r.AgentID, req)
			})},
	}
}

// request serves wait.request.
func (o *Requests) request(ctx context.Context, q *quotas.Quotas, tz string, r action.Request) (any, error) {
	spec, err := DecodeWaitRequest(r.Body, o.now(), tz)
	if err != nil {
		return nil, err
	}
	if !action.Replayed(ctx, o.store.Get, r.AgentID, spec.Request.RequestID, subjects.WaitIDFor) {
		if err := q.Wait(ctx, r.AgentID); err != nil {
			return nil, err
		}
	}
	w, err := o.store.Create(ctx, r.AgentID, spec)
	if err != nil {
		return nil, err
	}
	return WaitReply{WaitID: w.ID, TargetTime: subjects.FormatISO(w.Target()), Mode: w.Mode}, nil
}

// list serves wait.list: a page of the agent's managed waits and one of
// its WaitFor registrations, at most limit of each; the cursor holds where
// each walk is (a finished one stays at its end).
func (o *Requests) list(ctx context.Context, wf *waitfor.Service, r action.Request) (any, error) {
	page, err := DecodeListWaits(r.Body)
	if err != nil {
		return nil, err
	}
	reply := ListWaitsReply{Waits: []Wait{}, WaitFor: []waitfor.WaitFor{}}
	next := []subjects.CursorPos{page.Walk(0), page.Walk(1)}
	if !next[0].End() {
		if reply.Waits, next[0], err = o.store.Page(ctx, r.AgentID, page.Limit, next[0]); err != nil {
			return nil, err
		}
	}
	if wf == nil {
		next[1] = subjects.CursorPos{Buckets: 1, Bucket: 1} // none to walk
	} else if !next[1].End() {
		if reply.WaitFor, next[1], err = wf.List(ctx, r.AgentID, page.Limit, next[1]); err != nil {
			return nil, err
		}
	}
	reply.NextCursor = subjects.EncodeCursor(ActionWaitList, next...)
	return reply, nil
}

// interventionLimit: an intervention's text may be as long as its
// deliveries can carry, which Intervene checks against the inbox; its
// body is bounded by the most that could still decode to such a text
// (every byte escaped as \uXXXX: six to one), so that HTTP, where no
// server's max payload bounds it, never reads more.
func (o *Requests) interventionLimit() int64 {
	if o == nil {
		return subjects.MaxRequestBody
	}
	return 6*o.Room() + subjects.MaxRequestBody
}
