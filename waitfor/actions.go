package waitfor

import (
	"context"
	"net/http"

	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/quotas"
)

// Actions are the WaitFor actions, served by s (nil: answered
// unavailable) under q's bound on live registrations.
func (s *Service) Actions(q *quotas.Quotas) []action.Action {
	h := func(fn action.Handler) action.Handler { return action.When(s != nil, "WaitFor is not configured", fn) }
	return []action.Action{
		{Name: ActionWaitFor, Tool: &action.Tool{Name: "wait_for", Prompt: "wait_for.md", Later: later{s}}, Body: "WaitFor request", Reply: "{wait_id, continuation, ...}", Command: "wait-for", Access: action.Agent, Summary: "yield until a task result, timer, callback, monitor event or recheck wakes the agent",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/wait-for", http.StatusOK, nil),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				spec, err := DecodeWaitFor(r.Body)
				if err != nil {
					return nil, err
				}
				if err := q.WaitFor(r.AgentID, spec.WorkItemID); err != nil {
					return nil, err
				}
				return s.WaitFor(ctx, r.AgentID, spec)
			})},
		{Name: ActionWaitTasks, Tool: &action.Tool{Name: "wait_for_tasks", Prompt: "wait_for_tasks.md", Later: later{s}}, Body: "{task_ids, mode, reason, delivery?, work_item_id?}", Reply: "{wait_id, continuation, ...}", Command: "wait-tasks", Access: action.Agent, Summary: "yield until all or any of a set of tasks have results",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/wait-tasks", http.StatusOK, nil),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				spec, err := DecodeWaitTasks(r.Body)
				if err != nil {
					return nil, err
				}
				if err := q.WaitFor(r.AgentID, spec.WorkItemID); err != nil {
					return nil, err
				}
				return s.WaitTasks(ctx, r.AgentID, spec)
			})},
		{Name: ActionWaitReport, Tool: &action.Tool{Prompt: "wait_report.md"}, Body: "{wait_id, text}", Reply: "the committed WaitFor", Command: "wait-report", Access: action.Agent, Summary: "commit a prepared WaitFor with the agent's final report",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/wait-for/{wait_id}/report", http.StatusOK, action.PathField("wait_id")),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				req, err := DecodeWaitReport(r.Body)
				if err != nil {
					return nil, err
				}
				return s.Report(ctx, r.AgentID, req)
			})},
		{Name: ActionSystemWake, Body: "{text?}", Reply: "{ok}", Access: action.Operator, Summary: "wake the agent's WaitFor registrations as a system event",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/wake", http.StatusOK, nil),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				req, err := DecodeSystemWake(r.Body)
				if err != nil {
					return nil, err
				}
				return s.SystemWake(ctx, r.AgentID, req)
			})},
	}
}
