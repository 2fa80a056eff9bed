package api

import (
	"context"

	"github.com/chime-nats/chime/subjects"
)

// task runs one agent.<id>.task.* action.
func (o *Operations) task(ctx context.Context, action, agentID string, body []byte) (any, error) {
	if o.tasks == nil {
		return nil, &subjects.Error{Code: subjects.CodeUnavailable, Message: "tasks are not configured"}
	}
	switch action {
	case subjects.ActionTaskStart:
		req, err := subjects.DecodeStartTask(body)
		if err != nil {
			return nil, err
		}
		return o.tasks.Start(ctx, agentID, req)
	case subjects.ActionTaskResult:
		req, err := subjects.DecodeTaskResult(body)
		if err != nil {
			return nil, err
		}
		return o.tasks.Result(ctx, agentID, req)
	case subjects.ActionTaskList:
		page, err := subjects.DecodeListTasks(body)
		if err != nil {
			return nil, err
		}
		list, next, err := o.tasks.List(ctx, agentID, page.Limit, page.Walk(0))
		if err != nil {
			return nil, err
		}
		return subjects.ListTasksReply{Tasks: list, NextCursor: subjects.EncodeCursor(action, next)}, nil
	case subjects.ActionTaskOutput:
		r, err := subjects.DecodeTaskOutput(body)
		if err != nil {
			return nil, err
		}
		return o.tasks.Output(ctx, agentID, r)
	case subjects.ActionTaskOutputAppend:
		req, err := subjects.DecodeAppendOutput(body)
		if err != nil {
			return nil, err
		}
		return o.tasks.Append(ctx, agentID, req)
	}
	taskID, err := subjects.DecodeTaskRef(body)
	if err != nil {
		return nil, err
	}
	if action == subjects.ActionTaskGet {
		return o.tasks.Get(ctx, agentID, taskID)
	}
	return o.tasks.Cancel(ctx, agentID, taskID)
}
