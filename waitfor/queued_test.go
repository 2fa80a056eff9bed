package waitfor_test

import (
	"context"
	"testing"
	"time"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waitfor"
)

// finishedTask is a task whose record is finished, its result not
// consumed: the result is queued, or being stored right now.
type finishedTask struct{}

func (finishedTask) LookupTask(_ context.Context, agentID, taskID string) (*waitfor.TaskState, error) {
	return &waitfor.TaskState{AgentID: agentID, Terminal: true, ResultEnvelopeID: tasks.TaskEnvelopeID(taskID)}, nil
}

// TestQueuedResultStoredLateDeliversNoWoken: a task's record is finished
// before its task_result is stored. A WaitFor in between answers
// task_result_queued; when the result is then stored (after the WaitFor,
// so it would match it) and applied, it re-enters the agent alone: no
// wait_woken follows it.
func TestQueuedResultStoredLateDeliversNoWoken(t *testing.T) {
	ns := natstest.Server(t)
	_, res := natstest.Provisioned(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	inbox := consumer.NewInbox(res.JS, engine.InboxStream, time.Minute, nil)
	store := waitfor.NewStore(res.WaitFor, nil, kvrec.Retention{})
	s := waitfor.NewService(waitfor.Config{
		Store: store, Timers: timers.NewStore(res.Timers, nil, kvrec.Retention{}), Tasks: finishedTask{},
		Inbox: inbox, JS: res.JS, InboxStream: engine.InboxStream, EventsStream: engine.EventsStream,
	})
	spec, err := waitfor.DecodeWaitFor([]byte(`{"wake":"task_result","resource":"t1","reason":"the build","delivery":"silent"}`))
	if err != nil {
		t.Fatal(err)
	}
	reply, err := s.WaitFor(ctx, "late", spec)
	if err != nil {
		t.Fatal(err)
	}
	if reply.Disposition != waitfor.DispositionTaskResultQueued || reply.Continuation != waitfor.YieldAndReenter || reply.WaitRegistered {
		t.Fatalf("reply %+v", reply)
	}
	w, err := store.Get(ctx, "late", reply.WaitID)
	if err != nil {
		t.Fatal(err)
	}
	env := subjects.Envelope{ID: tasks.TaskEnvelopeID("t1"), AgentID: "late", Kind: subjects.KindTaskResult, At: time.Now(),
		Source: subjects.Source{Type: "task", ID: "t1"}, Trust: subjects.TrustExternal}
	ack, err := inbox.Deliver(ctx, &env)
	if err != nil {
		t.Fatal(err)
	}
	if ack.Sequence <= w.SinceSeq {
		t.Fatalf("the result at %d, not after the WaitFor's %d", ack.Sequence, w.SinceSeq)
	}
	if err := s.Apply(ctx, w, &env, ack.Sequence); err != nil {
		t.Fatal(err)
	}
	st, err := res.JS.Stream(ctx, engine.InboxStream)
	if err != nil {
		t.Fatal(err)
	}
	last, err := st.GetLastMsgForSubject(ctx, subjects.Inbox("late"))
	if err != nil {
		t.Fatal(err)
	}
	if last.Sequence != ack.Sequence {
		t.Fatalf("something followed the result: %s", last.Data)
	}
}
