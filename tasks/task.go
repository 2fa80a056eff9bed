package tasks

import (
	"encoding/json"
	"fmt"
	"github.com/chime-nats/chime/subjects"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Task actions: agent.<id>.task.<action>.
const (
	ActionTaskStart        = "task.start"
	ActionTaskResult       = "task.result"
	ActionTaskGet          = "task.get"
	ActionTaskList         = "task.list"
	ActionTaskCancel       = "task.cancel"
	ActionTaskOutput       = "task.output"
	ActionTaskOutputAppend = "task.output.append"
)

// Task error codes.
const (
	CodeTaskNotFound = "task_not_found"
	// CodeTaskOwned refuses an action on a task ID another agent holds.
	CodeTaskOwned = "task_owned_by_another_agent"
	// CodeTaskHasResult refuses a second, different result (or an append
	// or cancel after the result).
	CodeTaskHasResult = "task_has_result"
	// CodeTaskOutputOrder refuses an append whose seq is not the next.
	CodeTaskOutputOrder = "task_output_out_of_order"
)

// Sentinels for errors.Is.
var (
	ErrTaskNotFound    = &subjects.Error{Code: CodeTaskNotFound}
	ErrTaskOwned       = &subjects.Error{Code: CodeTaskOwned}
	ErrTaskHasResult   = &subjects.Error{Code: CodeTaskHasResult}
	ErrTaskOutputOrder = &subjects.Error{Code: CodeTaskOutputOrder}
)

// TaskNotFound is the error of an unknown task of the agent's.
func TaskNotFound(taskID string) *subjects.Error {
	return &subjects.Error{Code: CodeTaskNotFound, Message: fmt.Sprintf("task %s not found", taskID)}
}

// TaskOwned is the error of a task ID registered to another agent.
func TaskOwned(taskID string) *subjects.Error {
	return &subjects.Error{Code: CodeTaskOwned, Message: fmt.Sprintf("task %s belongs to another agent", taskID)}
}

// TaskHasResult is the error of a change to a finished task.
func TaskHasResult(taskID string) *subjects.Error {
	return &subjects.Error{Code: CodeTaskHasResult, Message: fmt.Sprintf("task %s already has a result", taskID)}
}

// Task output limits.
const (
	// MaxInlineOutput is the largest output kept in the record itself;
	// beyond it the output goes to the object store.
	MaxInlineOutput = 16 << 10
	// OutputPreview is how much of a stored output the record and the
	// envelope carry inline.
	OutputPreview = 4 << 10
	// MaxAppendChunk is the largest task.output.append data: base64 and
	// JSON keep its body under MaxAppendBody.
	MaxAppendChunk = 48 << 10
	// MaxAppendBody is the body limit of task.output.append.
	MaxAppendBody = 80 << 10
	// MaxTaskOutput bounds one task's whole output.
	MaxTaskOutput = 64 << 20
	// MaxOutputRead is the most task.output returns at once: base64 of it
	// stays well inside NATS's 1 MiB max payload.
	MaxOutputRead = 512 << 10
	// MaxTitleLen bounds a task title, in characters.
	MaxTitleLen = 1024
)

// TaskStatus is where a task is.
type TaskStatus string

// Task statuses; every one but running is a result.
const (
	TaskRunning     TaskStatus = "running"
	TaskCompleted   TaskStatus = "completed"
	TaskFailed      TaskStatus = "failed"
	TaskCancelled   TaskStatus = "cancelled"
	TaskInterrupted TaskStatus = "interrupted"
)

// ResultStatuses are the statuses a task.result may report.
func ResultStatuses() []TaskStatus {
	return []TaskStatus{TaskCompleted, TaskFailed, TaskCancelled, TaskInterrupted}
}

// Task is the record of a task, key <agent>.<task_id> of the tasks bucket.
type Task struct {
	ID        string     `json:"task_id"`
	AgentID   string     `json:"agent_id"`
	Title     string     `json:"title,omitempty"`
	Status    TaskStatus `json:"status"`
	CreatedAt time.Time  `json:"created_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	ExitCode  *int       `json:"exit_code,omitempty"`
	// Error is the result's error text: error_message, as a reply's
	// "error" key means the request failed.
	Error string `json:"error_message,omitempty"`
	// Output is the whole output, or its preview when OutputRef is set.
	Output     string `json:"output,omitempty"`
	OutputSize int64  `json:"output_size,omitempty"`
	// OutputRef names the whole output in the object store; read it
	// with task.output.
	OutputRef string `json:"output_ref,omitempty"`
	// AppendedParts and AppendedBytes count task.output.append chunks.
	AppendedParts int64 `json:"appended_parts,omitempty"`
	AppendedBytes int64 `json:"appended_bytes,omitempty"`
	// ResultHash identifies the result stored, so an identical retry is
	// answered and a different one refused.
	ResultHash string `json:"result_hash,omitempty"`
	// AttachHash identifies the output and exit an executor attached to
	// a task chime cancelled (its result with status cancelled), so that
	// a retry of it is answered unchanged and another is refused.
	AttachHash string `json:"attach_hash,omitempty"`
	// DeliveredAt is set once the task_result envelope is stored; a
	// finished task without it is delivered by the next result retry,
	// cancel or get.
	DeliveredAt *time.Time `json:"delivered_at,omitempty"`
	// ResultSeq is the task_result envelope's sequence in the inbox
	// stream, written with DeliveredAt (0 when unknown: delivered by an
	// earlier version, or found stored beyond the dedup window). WaitFor
	// compares it with the agent's inbox cursor: at or below it, the agent
	// has consumed the result.
	ResultSeq uint64 `json:"result_seq,omitempty"`
}

// Finished reports whether the task has its result.
func (t *Task) Finished() bool { return t.Status != "" && t.Status != TaskRunning }

// CancelledByChime reports whether a cancel, not an executor, ended the task.
func (t *Task) CancelledByChime() bool { return t.ResultHash == cancelHash }

// attachable reports whether an executor may still attach what its
// command left to t, a task chime cancelled: output chunks, and one
// result with status cancelled, which keeps the status and the delivery
// and adds the output and exit code.
func (t *Task) attachable() bool { return t.CancelledByChime() && t.AttachHash == "" }

// TaskKey is the KV key of a task record.
func TaskKey(agentID, taskID string) string { return agentID + "." + taskID }

// TaskEnvelopeID is the stable envelope ID of a task's result.
func TaskEnvelopeID(taskID string) string { return "task_" + taskID + "_result" }

// TaskResultData is the data of a task_result delivery.
type TaskResultData struct {
	TaskID     string     `json:"task_id"`
	Status     TaskStatus `json:"status"`
	ExitCode   *int       `json:"exit_code,omitempty"`
	Error      string     `json:"error_message,omitempty"`
	Output     string     `json:"output,omitempty"`
	OutputSize int64      `json:"output_size,omitempty"`
	OutputRef  string     `json:"output_ref,omitempty"`
}

// TaskResultText is the text of a task_result delivery.
func TaskResultText(t *Task) string {
	if t.ExitCode != nil {
		return fmt.Sprintf("Task %s %s (exit code %d).", t.ID, t.Status, *t.ExitCode)
	}
	return fmt.Sprintf("Task %s %s.", t.ID, t.Status)
}

// TaskResultEnvelope builds a finished task's one delivery. A result an
// executor reported is external evidence (command output, whatever it
// quotes); a cancel chime made carries nothing but chime's own record.
func TaskResultEnvelope(t *Task, cancelledByChime bool) subjects.Envelope {
	data, _ := subjects.EncodeJSON(TaskResultData{
		TaskID: t.ID, Status: t.Status, ExitCode: t.ExitCode, Error: t.Error,
		Output: t.Output, OutputSize: t.OutputSize, OutputRef: t.OutputRef,
	})
	trust := subjects.TrustExternal
	if cancelledByChime {
		trust = subjects.TrustSystem
	}
	at := t.CreatedAt
	if t.EndedAt != nil {
		at = *t.EndedAt
	}
	return subjects.Envelope{
		ID: TaskEnvelopeID(t.ID), AgentID: t.AgentID, Kind: subjects.KindTaskResult, At: at,
		Source: subjects.Source{Type: "task", ID: t.ID}, Trust: trust, Text: TaskResultText(t), Data: data,
	}
}

// StartTaskRequest is the body of task.start.
type StartTaskRequest struct {
	TaskID string `json:"task_id,omitempty"`
	Title  string `json:"title,omitempty"`
}

// Validate checks a start.
func (r *StartTaskRequest) Validate() error {
	if r.TaskID != "" {
		if err := subjects.ValidateID("task_id", r.TaskID); err != nil {
			return err
		}
	}
	if utf8.RuneCountInString(r.Title) > MaxTitleLen {
		return &subjects.Error{Code: subjects.CodeInvalidRequest, Message: fmt.Sprintf("title must be at most %d characters", MaxTitleLen)}
	}
	return nil
}

// DecodeStartTask decodes a task.start body.
func DecodeStartTask(data []byte) (*StartTaskRequest, error) {
	var r StartTaskRequest
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return nil, err
	}
	return &r, r.Validate()
}

// TaskResultRequest is the body of task.result. OutputAppended says the
// output is what task.output.append stored (then output must be absent).
type TaskResultRequest struct {
	TaskID         string     `json:"task_id"`
	Status         TaskStatus `json:"status"`
	Output         *string    `json:"output,omitempty"`
	OutputAppended bool       `json:"output_appended,omitempty"`
	Error          string     `json:"error,omitempty"`
	ExitCode       *int       `json:"exit_code,omitempty"`
}

// Validate checks a result.
func (r *TaskResultRequest) Validate() error {
	if err := subjects.ValidateID("task_id", r.TaskID); err != nil {
		return err
	}
	if r.Status == "" {
		return &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "status is required"}
	}
	if !slices.Contains(ResultStatuses(), r.Status) {
		return &subjects.Error{Code: subjects.CodeInvalidRequest, Message: fmt.Sprintf("invalid task status %q: one of completed, failed, cancelled, interrupted", r.Status)}
	}
	if r.Output != nil && r.OutputAppended {
		return &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "output and output_appended are exclusive"}
	}
	if utf8.RuneCountInString(r.Error) > MaxInlineOutput {
		return &subjects.Error{Code: subjects.CodeInvalidRequest, Message: fmt.Sprintf("error must be at most %d characters", MaxInlineOutput)}
	}
	return nil
}

// DecodeTaskResult decodes a task.result body.
func DecodeTaskResult(data []byte) (*TaskResultRequest, error) {
	var r TaskResultRequest
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return nil, err
	}
	return &r, r.Validate()
}

// TaskRef names one task: the body of task.get and task.cancel.
type TaskRef struct {
	TaskID string `json:"task_id"`
}

// Validate checks the task ID.
func (r *TaskRef) Validate() error { return subjects.ValidateID("task_id", r.TaskID) }

// DecodeTaskRef decodes a task.get or task.cancel body.
func DecodeTaskRef(data []byte) (string, error) {
	var r TaskRef
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return "", err
	}
	return r.TaskID, r.Validate()
}

// ListTasksRequest is the body of task.list: a listing's.
type ListTasksRequest = subjects.ListRequest

// DecodeListTasks decodes a task.list body: its limit and cursor.
func DecodeListTasks(data []byte) (subjects.ListPage, error) {
	return subjects.DecodeListPage(ActionTaskList, 1, data)
}

// ListTasksReply is a page of a task listing, in the order of each
// task's last change, oldest first; NextCursor as for timers.
type ListTasksReply struct {
	Tasks      []Task `json:"tasks"`
	NextCursor string `json:"next_cursor"`
}

// TaskOutputRequest is the body of task.output.
type TaskOutputRequest struct {
	TaskID string          `json:"task_id"`
	Offset json.RawMessage `json:"offset,omitempty"`
	Limit  json.RawMessage `json:"limit,omitempty"`
}

// OutputRange is a validated task.output request.
type OutputRange struct {
	TaskID        string
	Offset, Limit int64
}

// DecodeTaskOutput decodes a task.output body: offset defaults to 0, limit
// to (and at most) MaxOutputRead.
func DecodeTaskOutput(data []byte) (*OutputRange, error) {
	var r TaskOutputRequest
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return nil, err
	}
	if err := subjects.ValidateID("task_id", r.TaskID); err != nil {
		return nil, err
	}
	out := &OutputRange{TaskID: r.TaskID, Limit: MaxOutputRead}
	if !subjects.IsNull(r.Offset) && string(r.Offset) != "0" {
		n, err := subjects.PositiveInt("offset", r.Offset, MaxTaskOutput)
		if err != nil {
			return nil, err
		}
		out.Offset = n
	}
	if !subjects.IsNull(r.Limit) {
		n, err := subjects.PositiveInt("limit", r.Limit, MaxOutputRead)
		if err != nil {
			return nil, err
		}
		out.Limit = n
	}
	return out, nil
}

// TaskOutputReply is one chunk of a task's output; data is base64 on the
// wire. Read until eof, asking from offset+len(data).
type TaskOutputReply struct {
	TaskID string `json:"task_id"`
	Offset int64  `json:"offset"`
	Size   int64  `json:"size"`
	Data   []byte `json:"data"`
	EOF    bool   `json:"eof"`
}

// AppendOutputRequest is the body of task.output.append: the chunk at seq
// (0, 1, 2...) of the task's output, base64 on the wire.
type AppendOutputRequest struct {
	TaskID string `json:"task_id"`
	Seq    *int64 `json:"seq"`
	Data   []byte `json:"data"`
}

// Validate checks an append.
func (r *AppendOutputRequest) Validate() error {
	if err := subjects.ValidateID("task_id", r.TaskID); err != nil {
		return err
	}
	if r.Seq == nil {
		return &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "seq is required"}
	}
	if *r.Seq < 0 {
		return &subjects.Error{Code: subjects.CodeInvalidRequest, Message: fmt.Sprintf("seq must not be negative, not %d", *r.Seq)}
	}
	if len(r.Data) == 0 {
		return &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "data must not be empty"}
	}
	if len(r.Data) > MaxAppendChunk {
		return &subjects.Error{Code: subjects.CodePayloadTooLarge, Message: fmt.Sprintf("data larger than %d KiB", MaxAppendChunk>>10)}
	}
	return nil
}

// DecodeAppendOutput decodes a task.output.append body.
func DecodeAppendOutput(data []byte) (*AppendOutputRequest, error) {
	var r AppendOutputRequest
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return nil, err
	}
	return &r, r.Validate()
}

// AppendOutputReply acknowledges an append: the next seq to send.
type AppendOutputReply struct {
	TaskID  string `json:"task_id"`
	NextSeq int64  `json:"next_seq"`
	Bytes   int64  `json:"bytes"`
}

// Preview is the start of output, at most OutputPreview bytes, cut at a
// character boundary and with invalid bytes replaced.
func Preview(output []byte) string {
	n := min(len(output), OutputPreview)
	for n > 0 && n < len(output) && !utf8.RuneStart(output[n]) {
		n--
	}
	return toValidUTF8(output[:n])
}

func toValidUTF8(b []byte) string { return strings.ToValidUTF8(string(b), "\uFFFD") }
