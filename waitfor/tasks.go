package waitfor

import (
	"context"
	"errors"

	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
)

// Tasks answers WaitFor's task questions from the tasks store.
type Tasks struct{ Store *tasks.Store }

// LookupTask reports taskID as agentID sees it: nil when no agent holds
// it (WaitFor refuses it, see checkTask), another agent's as such, and
// terminal as soon as its record is: the record is finished before its task_result is stored. chime does
// not know whether the agent has read a result, so a finished task's
// result counts as queued, never as consumed.
func (t Tasks) LookupTask(ctx context.Context, agentID, taskID string) (*TaskState, error) {
	task, err := t.Store.Get(ctx, agentID, taskID)
	switch {
	case errors.Is(err, tasks.ErrTaskOwned):
		return &TaskState{AgentID: ""}, nil
	case errors.Is(err, tasks.ErrTaskNotFound):
		return nil, nil
	case err != nil:
		return nil, err
	}
	st := &TaskState{AgentID: task.AgentID, Terminal: task.Finished()}
	if st.Terminal {
		st.ResultEnvelopeID = tasks.TaskEnvelopeID(task.ID)
	}
	return st, nil
}

// TaskResult returns taskID's task_result envelope as delivered, or nil
// while the task runs.
func (t Tasks) TaskResult(ctx context.Context, agentID, taskID string) (*subjects.Envelope, error) {
	task, err := t.Store.Get(ctx, agentID, taskID)
	if err != nil || !task.Finished() {
		return nil, err
	}
	env := tasks.TaskResultEnvelope(task, false)
	return &env, nil
}
