package client

import (
	"context"
	"fmt"

	"github.com/chime-nats/chime/tasks"
)

// StartTask registers a running task; an empty taskID lets chime choose
// one (task_...).
func (c *Client) StartTask(ctx context.Context, taskID, title string) (*tasks.Task, error) {
	var t tasks.Task
	return &t, c.call(ctx, tasks.ActionTaskStart, tasks.StartTaskRequest{TaskID: taskID, Title: title}, &t)
}

// ReportResult reports a task's result; chime delivers it to the agent
// once, as task_result. Retrying the identical result is safe.
func (c *Client) ReportResult(ctx context.Context, r tasks.TaskResultRequest) (*tasks.Task, error) {
	var t tasks.Task
	return &t, c.call(ctx, tasks.ActionTaskResult, r, &t)
}

// AppendOutput stores chunk seq (0, 1, ...) of a running task's output,
// at most subjects.MaxAppendChunk bytes; a retry of the same chunk is
// safe. Report the result with OutputAppended to use it.
func (c *Client) AppendOutput(ctx context.Context, taskID string, seq int64, data []byte) (*tasks.AppendOutputReply, error) {
	var r tasks.AppendOutputReply
	return &r, c.call(ctx, tasks.ActionTaskOutputAppend, tasks.AppendOutputRequest{TaskID: taskID, Seq: &seq, Data: data}, &r)
}

// GetTask reads one task.
func (c *Client) GetTask(ctx context.Context, taskID string) (*tasks.Task, error) {
	var t tasks.Task
	return &t, c.call(ctx, tasks.ActionTaskGet, tasks.TaskRef{TaskID: taskID}, &t)
}

// ListTasks returns the first page of the agent's tasks (TasksPage);
// limit 0 uses the default.
func (c *Client) ListTasks(ctx context.Context, limit int) ([]tasks.Task, error) {
	r, err := c.TasksPage(ctx, limit, "")
	if err != nil {
		return nil, err
	}
	return r.Tasks, nil
}

// TasksPage returns a page of the agent's tasks, as TimersPage does.
func (c *Client) TasksPage(ctx context.Context, limit int, cursor string) (*tasks.ListTasksReply, error) {
	var r tasks.ListTasksReply
	return &r, c.call(ctx, tasks.ActionTaskList, listRequest(limit, cursor), &r)
}

// CancelTask cancels a running task; its executor learns it when it next
// reports (task_has_result) or reads the task.
func (c *Client) CancelTask(ctx context.Context, taskID string) (*tasks.Task, error) {
	var t tasks.Task
	return &t, c.call(ctx, tasks.ActionTaskCancel, tasks.TaskRef{TaskID: taskID}, &t)
}

// ReadOutput reads a task's whole output, chunk by chunk.
func (c *Client) ReadOutput(ctx context.Context, taskID string) ([]byte, error) {
	var out []byte
	for {
		var r tasks.TaskOutputReply
		req := map[string]any{"task_id": taskID}
		if len(out) > 0 {
			req["offset"] = len(out)
		}
		if err := c.call(ctx, tasks.ActionTaskOutput, req, &r); err != nil {
			return nil, err
		}
		out = append(out, r.Data...)
		if r.EOF {
			return out, nil
		}
		if len(r.Data) == 0 {
			return nil, fmt.Errorf("client: output of %s ended at %d of %d bytes", taskID, len(out), r.Size)
		}
	}
}
