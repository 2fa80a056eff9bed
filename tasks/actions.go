package tasks

import (
	"context"
	"net/http"

	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/subjects"
)

// Actions are the task actions, served by s (nil: answered unavailable).
func (s *Store) Actions() []action.Action {
	h := func(fn action.Handler) action.Handler { return action.When(s != nil, "tasks are not configured", fn) }
	ref := action.Path(map[string]string{"task_id": "task_id"})
	return []action.Action{
		{Name: ActionTaskStart, Tool: &action.Tool{Prompt: "tasks.md"}, Body: "{task_id?, title?}", Reply: "task record", Access: action.Agent, Summary: "start a task: background work whose result reaches the inbox",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/tasks", http.StatusCreated, nil),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				req, err := DecodeStartTask(r.Body)
				if err != nil {
					return nil, err
				}
				return s.Start(ctx, r.AgentID, req)
			})},
		{Name: ActionTaskResult, Tool: &action.Tool{Prompt: "tasks.md"}, Body: "{task_id, status, output?, output_appended?, error?, exit_code?}", Reply: "task record", IDField: "task_id", Access: action.Agent, Summary: "report a task's result (completed, failed, interrupted)",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/tasks/{task_id}/result", http.StatusOK, action.PathField("task_id")),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				req, err := DecodeTaskResult(r.Body)
				if err != nil {
					return nil, err
				}
				return s.Result(ctx, r.AgentID, req)
			})},
		{Name: ActionTaskGet, Tool: &action.Tool{Prompt: "tasks.md"}, Body: "{task_id}", Reply: "task record", IDField: "task_id", Access: action.Agent, Summary: "read one task",
			HTTP:   action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/tasks/{task_id}", http.StatusOK, ref),
			Handle: h(s.byRef(s.Get))},
		{Name: ActionTaskList, Tool: &action.Tool{Prompt: "tasks.md"}, Body: "{limit?, cursor?}", Reply: "{tasks, next_cursor}", Access: action.Agent, Summary: "list the agent's tasks, a page at a time",
			Columns: []string{"task_id", "status", "title", "created_at", "ended_at", "exit_code"},
			HTTP:    action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/tasks", http.StatusOK, action.List),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				page, err := DecodeListTasks(r.Body)
				if err != nil {
					return nil, err
				}
				list, next, err := s.List(ctx, r.AgentID, page.Limit, page.Walk(0))
				if err != nil {
					return nil, err
				}
				return ListTasksReply{Tasks: list, NextCursor: subjects.EncodeCursor(ActionTaskList, next)}, nil
			})},
		{Name: ActionTaskCancel, Tool: &action.Tool{Prompt: "tasks.md"}, Body: "{task_id}", Reply: "task record", IDField: "task_id", Access: action.Agent, Summary: "ask a running task to stop",
			HTTP:   action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/tasks/{task_id}/cancel", http.StatusOK, ref),
			Handle: h(s.byRef(s.Cancel))},
		{Name: ActionTaskOutput, Tool: &action.Tool{Prompt: "tasks.md"}, Body: "{task_id, offset?, limit?}", Reply: "{task_id, offset, size, data, eof}", IDField: "task_id", Access: action.Agent, Summary: "read a task's output from an offset",
			HTTP: action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/tasks/{task_id}/output", http.StatusOK,
				action.Path(map[string]string{"task_id": "task_id"}, "offset", "limit")),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				req, err := DecodeTaskOutput(r.Body)
				if err != nil {
					return nil, err
				}
				return s.Output(ctx, r.AgentID, req)
			})},
		{Name: ActionTaskOutputAppend, Tool: &action.Tool{Prompt: "tasks.md"}, Body: "{task_id, seq, data}", Reply: "{task_id, next_seq, bytes}", IDField: "task_id", Access: action.Agent, Summary: "append to a running task's output",
			HTTP:    action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/tasks/{task_id}/output", http.StatusOK, action.PathField("task_id")),
			MaxBody: func() int64 { return MaxAppendBody },
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				req, err := DecodeAppendOutput(r.Body)
				if err != nil {
					return nil, err
				}
				return s.Append(ctx, r.AgentID, req)
			})},
	}
}

// byRef serves an action on one task named by its body's task_id.
func (s *Store) byRef(do func(ctx context.Context, agentID, taskID string) (*Task, error)) action.Handler {
	return func(ctx context.Context, r action.Request) (any, error) {
		taskID, err := DecodeTaskRef(r.Body)
		if err != nil {
			return nil, err
		}
		return do(ctx, r.AgentID, taskID)
	}
}
