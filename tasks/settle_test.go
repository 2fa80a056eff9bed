package tasks_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
)

// TestStoredResultIsDeliveredWithoutRetry: the inbox stream is gone when a
// result (or a cancel) is reported, so the record is stored finished and
// its delivery fails; the reporter never retries. Once the stream is back,
// another replica's Settler delivers the result from its work item when
// it is due, exactly once.
func TestStoredResultIsDeliveredWithoutRetry(t *testing.T) {
	for _, tc := range []struct {
		name   string
		report func(ctx context.Context, s *tasks.Store) error
		status tasks.TaskStatus
	}{
		{"result", func(ctx context.Context, s *tasks.Store) error {
			_, err := s.Result(ctx, "a", &tasks.TaskResultRequest{TaskID: "t1", Status: tasks.TaskCompleted, Output: text("done")})
			return err
		}, tasks.TaskCompleted},
		{"cancel", func(ctx context.Context, s *tasks.Store) error {
			_, err := s.Cancel(ctx, "a", "t1")
			return err
		}, tasks.TaskCancelled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := natstest.Server(t)
			_, res := natstest.Provisioned(t, ns)
			e := &env{res: res}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			store := func() *tasks.Store {
				return tasks.NewStore(tasks.Config{KV: res.Tasks, Outputs: res.TaskOutputs, JS: res.JS, SettleAfter: time.Second,
					Inbox: consumer.NewInbox(res.JS, engine.InboxStream, 2*time.Minute, nil)})
			}
			reporter := store()
			if _, err := reporter.Start(ctx, "a", &tasks.StartTaskRequest{TaskID: "t1"}); err != nil {
				t.Fatal(err)
			}
			if err := res.JS.DeleteStream(ctx, engine.InboxStream); err != nil {
				t.Fatal(err)
			}
			// A request's own deadline: delivery is retried within it.
			rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
			err := tc.report(rctx, reporter)
			rcancel()
			if err == nil {
				t.Fatal("reported into a missing inbox stream: no error")
			}
			stored, _, err := reporter.List(ctx, "a", 10, subjects.CursorPos{})
			if err != nil {
				t.Fatal(err)
			}
			if len(stored) != 1 || stored[0].Status != tc.status || stored[0].DeliveredAt != nil {
				t.Fatalf("after the failed delivery the record is %+v, want %s and undelivered", stored, tc.status)
			}
			natstest.Provisioned(t, ns) // the inbox stream is back, empty

			settler := tasks.NewSettler(tasks.SettlerConfig{JS: res.JS, Stream: engine.EventsStream, Store: store()})
			if err := settler.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer settler.Stop(context.Background())
			testwait.Eventually(t, 20*time.Second, func() bool {
				rec, _, err := kvrec.Get[tasks.Task](ctx, res.Tasks, tasks.TaskKey("a", "t1"))
				if err != nil {
					t.Fatal(err)
				}
				return rec.DeliveredAt != nil
			}, "the stored result delivered")
			got := e.results(t, "a")
			if len(got) != 1 || got[0].Source.ID != "t1" {
				t.Fatalf("task_result envelopes %+v, want one for t1", got)
			}
			// The reporter's late retry changes nothing.
			if err := tc.report(ctx, reporter); err != nil {
				t.Fatal(err)
			}
			if got := e.results(t, "a"); len(got) != 1 {
				t.Fatalf("after a retry %d task_result envelopes, want 1", len(got))
			}
		})
	}
}

// TestSettleItemOfAResultThatNeverLanded: a due work item whose task has
// not finished (its reporter died before storing the result) is dropped,
// not redelivered for hours.
func TestSettleItemOfAResultThatNeverLanded(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.store.Start(ctx, "a", &tasks.StartTaskRequest{TaskID: "t1"}); err != nil {
		t.Fatal(err)
	}
	// The work item of a reporter that died before storing the result, as
	// the engine delivers it when due.
	if _, err := e.res.JS.Publish(ctx, subjects.TaskSettle("a", "t1"), nil); err != nil {
		t.Fatal(err)
	}
	settler := tasks.NewSettler(tasks.SettlerConfig{JS: e.res.JS, Stream: engine.EventsStream, Store: e.store})
	if err := settler.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer settler.Stop(context.Background())
	testwait.Until(t, 20*time.Second, func() (bool, string) {
		c, err := e.res.JS.Consumer(ctx, engine.EventsStream, tasks.SettleDurable)
		if err != nil {
			t.Fatal(err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.AckFloor.Stream > 0 && info.NumAckPending == 0 && info.NumPending == 0, fmt.Sprintf("%+v", info)
	}, "work item dropped")
	if got := e.results(t, "a"); len(got) != 0 {
		t.Fatalf("a task that never finished delivered %+v", got)
	}
}
