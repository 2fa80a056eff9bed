package api_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
)

// TestTasksOverNATS: the client's task calls against a replica, a 1 MiB
// output appended and read back with ReadOutput, and bad input refused
// with its code and nothing stored.
func TestTasksOverNATS(t *testing.T) {
	_, nc := startChime(t)
	ctx := context.Background()
	c, err := client.New(nc, "agent-t")
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.StartTask(ctx, "", "big output")
	if err != nil || !strings.HasPrefix(task.ID, "task_") || task.Status != tasks.TaskRunning {
		t.Fatalf("start: %+v %v", task, err)
	}
	want := bytes.Repeat([]byte("line of output\n"), (1<<20)/15+1)[:1<<20]
	for seq := int64(0); int(seq)*tasks.MaxAppendChunk < len(want); seq++ {
		chunk := want[int(seq)*tasks.MaxAppendChunk : min(len(want), int(seq+1)*tasks.MaxAppendChunk)]
		if _, err := c.AppendOutput(ctx, task.ID, seq, chunk); err != nil {
			t.Fatalf("append %d: %v", seq, err)
		}
	}
	done, err := c.ReportResult(ctx, tasks.TaskResultRequest{TaskID: task.ID, Status: tasks.TaskCompleted, OutputAppended: true})
	if err != nil || done.OutputRef == "" || done.OutputSize != 1<<20 {
		t.Fatalf("result: %+v %v", done, err)
	}
	got, err := c.ReadOutput(ctx, task.ID)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes (%v), want %d", len(got), err, len(want))
	}
	if l, err := c.ListTasks(ctx, 0); err != nil || len(l) != 1 || l[0].ID != task.ID {
		t.Fatalf("list: %+v %v", l, err)
	}

	for _, tc := range []struct{ action, body, code, text string }{
		{"task.start", `{"task_id":"a.b"}`, subjects.CodeInvalidID, "task_id"},
		{"task.start", `{"task":"x"}`, subjects.CodeInvalidRequest, `unknown field "task"`},
		{"task.result", `{"task_id":"r1"}`, subjects.CodeInvalidRequest, "status is required"},
		{"task.result", `{"task_id":"r1","status":"done"}`, subjects.CodeInvalidRequest, "invalid task status"},
		{"task.result", `{"task_id":"r1","status":"completed","output":"x","output_appended":true}`, subjects.CodeInvalidRequest, "exclusive"},
		{"task.result", `{"task_id":"r1","status":"completed","exit_code":"3"}`, subjects.CodeInvalidRequest, "exit_code"},
		{"task.result", `{"task_id":"r1","status":"completed","output":"` + strings.Repeat("x", 70<<10) + `"}`, subjects.CodePayloadTooLarge, "larger than"},
		{"task.output.append", `{"task_id":"r1","seq":0,"data":"eA=="}`, tasks.CodeTaskNotFound, "task r1 not found"},
		{"task.output.append", `{"task_id":"r1","data":"eA=="}`, subjects.CodeInvalidRequest, "seq is required"},
		{"task.output", `{"task_id":"r1","limit":600000}`, subjects.CodeInvalidRequest, "limit is too large"},
		{"task.get", `{"task_id":"r1"}`, tasks.CodeTaskNotFound, "task r1 not found"},
		{"task.cancel", `{}`, subjects.CodeInvalidID, "task_id must not be empty"},
	} {
		err := c.Request(ctx, tc.action, []byte(tc.body), &struct{}{})
		var wire *subjects.Error
		if !errors.As(err, &wire) || wire.Code != tc.code || !strings.Contains(wire.Message, tc.text) {
			t.Errorf("%s %.80s: %v, want %s %q", tc.action, tc.body, err, tc.code, tc.text)
		}
	}
	if l, err := c.ListTasks(ctx, 0); err != nil || len(l) != 1 {
		t.Fatalf("a refusal stored something: %+v %v", l, err)
	}
	other, _ := client.New(nc, "agent-u")
	if _, err := other.ReportResult(ctx, tasks.TaskResultRequest{TaskID: task.ID, Status: tasks.TaskFailed}); !errors.Is(err, tasks.ErrTaskOwned) {
		t.Fatalf("another agent's result: %v", err)
	}
	if _, err := other.ReadOutput(ctx, task.ID); !errors.Is(err, tasks.ErrTaskOwned) {
		t.Fatalf("another agent's output: %v", err)
	}
}
