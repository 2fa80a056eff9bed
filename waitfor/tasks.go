package waitfor

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
)

// Tasks answers WaitFor's task questions from the tasks store.
type Tasks struct {
	Store *tasks.Store
	// Agents holds each agent's inbox cursor (inbox.ack); nil: no result
	// counts as consumed.
	Agents *agents.Store
	// JS and InboxStream find an agent's legacy durable inbox consumer
	// (inbox-<agent>), whose ack floor counts too; nil JS skips it.
	JS          jetstream.JetStream
	InboxStream string
}

// LookupTask reports taskID as agentID sees it: nil when no agent holds
// it (WaitFor refuses it, see checkTask), another agent's as such, and
// terminal as soon as its record is: the record is finished before its
// task_result is stored. A terminal task's result is consumed once the
// agent has acknowledged it: its inbox sequence (the task record's
// result_seq) is at or below the agent's cursor, or below the ack floor of
// its legacy inbox consumer. Whichever reader acked it counts: a result
// taken for queued that the agent already has would make it yield for a
// re-entry that never comes. A result whose sequence is not known yet (or
// was delivered by an earlier version) counts as queued.
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
	if !st.Terminal {
		return st, nil
	}
	st.ResultEnvelopeID = tasks.TaskEnvelopeID(task.ID)
	if task.ResultSeq != 0 && task.AgentID == agentID {
		read, err := t.readTo(ctx, agentID)
		if err != nil {
			return nil, err
		}
		st.ResultConsumed = task.ResultSeq <= read
	}
	return st, nil
}

// readTo is how far the agent has acknowledged its inbox: its cursor, or
// its legacy consumer's ack floor if that is further.
func (t Tasks) readTo(ctx context.Context, agentID string) (uint64, error) {
	var read uint64
	if t.Agents != nil {
		st, _, err := t.Agents.Get(ctx, agentID)
		if err != nil {
			return 0, fmt.Errorf("waitfor: inbox cursor: %w", err)
		}
		read = st.InboxAcked
	}
	if t.JS != nil && t.InboxStream != "" {
		c, err := t.JS.Consumer(ctx, t.InboxStream, agents.InboxConsumer(agentID))
		switch {
		case err == nil:
			read = max(read, c.CachedInfo().AckFloor.Stream)
		case !errors.Is(err, jetstream.ErrConsumerNotFound):
			return 0, fmt.Errorf("waitfor: inbox consumer of %s: %w", agentID, err)
		}
	}
	return read, nil
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
