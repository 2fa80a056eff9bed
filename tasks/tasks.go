// Package tasks owns tasks (async tool calls): task records in the tasks
// KV bucket (start, result, cancel, every change a CAS), which agent holds
// a task ID, the output chunks executors append and the whole outputs kept
// in the task output object store, and each finished task's one
// task_result delivery.
//
// Crash safety: a result is first announced by a settle work item on the
// events stream (a message schedule due SettleAfter later), then stored in the record (finished, with the hash of the
// result), then delivered under the stable envelope ID task_<id>_result,
// then marked delivered_at. A crash or a failed publish after the record
// is stored leaves a finished record without delivered_at, which the
// Settler, consuming the work items on any replica with JetStream's
// redelivery, completes whether or not the reporter retries (as a retry,
// a cancel or any get also do); the envelope ID keeps the delivery single.
package tasks

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/subjects"
)

// Store reads and writes tasks.
type Store struct {
	kv        jetstream.KeyValue
	outputs   jetstream.ObjectStore
	inbox     *consumer.Inbox
	js        jetstream.JetStream
	now       func() time.Time
	retention kvrec.Retention
	log       *slog.Logger
	// settleAfter is when a result's settle work item is due.
	settleAfter time.Duration
	admit       Admission
	// seqs keeps where the chunks of interleaved objects are.
	seqs seqCache
}

// Admission decides whether an agent may have more: the per-agent limits,
// which quotas.Quotas owns. Each method returns the refusal to answer.
type Admission interface {
	// StartTask admits a new task of the agent's: one that will run
	// (task.start), or, running false, one registered finished by its
	// first result.
	StartTask(agentID string, running bool) error
	// AddOutput admits n more bytes of the agent's stored task output.
	AddOutput(agentID string, n int64) error
}

// Config says what a Store works on.
type Config struct {
	KV jetstream.KeyValue // the tasks bucket
	// Outputs keeps outputs over subjects.MaxInlineOutput.
	Outputs   jetstream.ObjectStore
	Inbox     *consumer.Inbox
	JS        jetstream.JetStream
	Now       func() time.Time
	Retention kvrec.Retention
	Log       *slog.Logger
	// SettleAfter is when a result's settle work item is due (default
	// DefaultSettleAfter; see Settler).
	SettleAfter time.Duration
	// Admit, when set, admits new tasks and output bytes.
	Admit Admission
}

// NewStore returns a Store.
func NewStore(c Config) *Store {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.SettleAfter <= 0 {
		c.SettleAfter = DefaultSettleAfter
	}
	return &Store{kv: c.KV, outputs: c.Outputs, inbox: c.Inbox, js: c.JS, now: c.Now, retention: c.Retention, log: c.Log.With("component", "tasks"),
		settleAfter: c.SettleAfter, admit: c.Admit}
}

func (s *Store) admitStart(agentID string, running bool) error {
	if s.admit == nil {
		return nil
	}
	return s.admit.StartTask(agentID, running)
}

func (s *Store) admitOutput(agentID string, n int64) error {
	if s.admit == nil {
		return nil
	}
	return s.admit.AddOutput(agentID, n)
}

// owner records which agent holds a task ID. Its key, owner=<task_id>, is
// one token, so it never meets an <agent>.<task_id> key or listing.
type owner struct {
	AgentID  string `json:"agent_id"`
	Finished bool   `json:"finished,omitempty"`
}

func ownerKey(taskID string) string { return "owner=" + taskID }

// chunkKey is an appended chunk: three tokens, out of every listing.
func chunkKey(agentID, taskID string, seq int64) string {
	return agentID + "." + taskID + "." + strconv.FormatInt(seq, 10)
}

// claim registers taskID to agentID, atomically across agents and
// replicas: the first to create the owner key holds the ID.
func (s *Store) claim(ctx context.Context, agentID, taskID string) error {
	_, _, err := kvrec.Create(ctx, s.kv, ownerKey(taskID), &owner{AgentID: agentID}, func(o *owner) bool { return o.AgentID == agentID })
	if errors.Is(err, jetstream.ErrKeyExists) {
		return TaskOwned(taskID)
	}
	if err != nil {
		return fmt.Errorf("tasks: claim %s: %w", taskID, err)
	}
	return nil
}

// checkOwner refuses a task ID held by another agent; an unknown ID is
// the agent's task_not_found.
func (s *Store) checkOwner(ctx context.Context, agentID, taskID string) error {
	o, _, err := kvrec.Get[owner](ctx, s.kv, ownerKey(taskID))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return TaskNotFound(taskID)
	case err != nil:
		return fmt.Errorf("tasks: owner of %s: %w", taskID, err)
	case o.AgentID != agentID:
		return TaskOwned(taskID)
	}
	return nil
}

// Start registers a running task. A start of an ID the agent holds
// already answers its record as it is (a retry).
func (s *Store) Start(ctx context.Context, agentID string, req *StartTaskRequest) (*Task, error) {
	id := req.TaskID
	if id == "" {
		id = "task_" + nuid.Next()
	} else {
		// A retry answers the record and starts nothing: no limit applies.
		t, _, err := kvrec.Get[Task](ctx, s.kv, TaskKey(agentID, id))
		if err == nil {
			return t, nil
		}
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, fmt.Errorf("tasks: start %s: %w", id, err)
		}
	}
	if err := s.admitStart(agentID, true); err != nil {
		return nil, err
	}
	if err := s.claim(ctx, agentID, id); err != nil {
		return nil, err
	}
	t := &Task{ID: id, AgentID: agentID, Title: req.Title, Status: TaskRunning, CreatedAt: s.now().UTC()}
	stored, _, err := kvrec.Create(ctx, s.kv, TaskKey(agentID, id), t, func(*Task) bool { return true })
	if err != nil {
		return nil, fmt.Errorf("tasks: start %s: %w", id, err)
	}
	return stored, nil
}

// Get returns one of the agent's tasks, completing its delivery if a
// crash interrupted it.
func (s *Store) Get(ctx context.Context, agentID, taskID string) (*Task, error) {
	t, rev, err := s.getRev(ctx, agentID, taskID)
	if err != nil {
		return nil, err
	}
	return s.settle(ctx, t, rev)
}

func (s *Store) get(ctx context.Context, agentID, taskID string) (*Task, error) {
	t, _, err := s.getRev(ctx, agentID, taskID)
	return t, err
}

// getRev is get with the task's revision.
func (s *Store) getRev(ctx context.Context, agentID, taskID string) (*Task, uint64, error) {
	t, rev, err := kvrec.Get[Task](ctx, s.kv, TaskKey(agentID, taskID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		if oerr := s.checkOwner(ctx, agentID, taskID); errors.Is(oerr, ErrTaskOwned) {
			return nil, 0, oerr
		}
		return nil, 0, TaskNotFound(taskID)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("tasks: get %s: %w", taskID, err)
	}
	return t, rev, nil
}

// List returns a page of the agent's tasks, as timers.Store.List does
// for timers.
func (s *Store) List(ctx context.Context, agentID string, limit int, from subjects.CursorPos) ([]Task, subjects.CursorPos, error) {
	pg, err := kvrec.ListPage[Task](ctx, s.js, []string{s.kv.Bucket()}, agentID+".*", kvrec.Pos(from), limit, nil)
	if errors.Is(err, kvrec.ErrPos) {
		return nil, subjects.CursorPos{}, subjects.ErrCursorStale()
	}
	if err != nil {
		return nil, subjects.CursorPos{}, fmt.Errorf("tasks: list: %w", err)
	}
	return pg.Items, subjects.CursorPos(pg.Next), nil
}

// update changes a task by CAS; finished tasks expire after retention. It
// returns the task's revision with it. With cur (the task as the caller
// read it at rev) the first attempt decides from that copy, without a
// read (see kvrec.Current).
func (s *Store) update(ctx context.Context, agentID, taskID string, create bool, change func(*Task) (bool, error), cur *Task, rev uint64) (*Task, uint64, error) {
	opts := []kvrec.Option[Task]{kvrec.ExpireFinished(s.retention, (*Task).Finished)}
	if cur != nil && rev > 0 {
		cp := *cur
		opts = append(opts, kvrec.Current(&cp, rev))
	}
	t, rev, _, err := kvrec.UpdateRev(ctx, s.kv, TaskKey(agentID, taskID), create, change, opts...)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, TaskNotFound(taskID)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("tasks: update %s: %w", taskID, err)
	}
	return t, rev, nil
}

// resultHash identifies a result, so its identical retry is told apart
// from a different second result.
func resultHash(req *TaskResultRequest, appendedParts, appendedBytes int64) string {
	b, _ := json.Marshal(struct {
		*TaskResultRequest
		Parts, Bytes int64
	}{req, appendedParts, appendedBytes})
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:16])
}

// Result stores a task's result and delivers it once. A task not started
// is registered by its first result; an identical retry answers the
// stored record (and completes its delivery); any other second result is
// refused.
func (s *Store) Result(ctx context.Context, agentID string, req *TaskResultRequest) (*Task, error) {
	// A record under the agent's key proves the claim (it is written only
	// after one): a started task's result skips it.
	cur, rev, err := kvrec.Get[Task](ctx, s.kv, TaskKey(agentID, req.TaskID))
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("tasks: result %s: %w", req.TaskID, err)
	}
	if cur == nil {
		if err := s.admitStart(agentID, false); err != nil {
			return nil, err
		}
		if err := s.claim(ctx, agentID, req.TaskID); err != nil {
			return nil, err
		}
	}
	var parts, size int64
	if cur != nil && req.OutputAppended {
		parts, size = cur.AppendedParts, cur.AppendedBytes
	}
	hash := resultHash(req, parts, size)
	attach := false
	if cur != nil && cur.Finished() {
		switch {
		case cur.ResultHash == hash || cur.AttachHash == hash:
			if cur.DeliveredAt == nil {
				if err := s.announce(ctx, agentID, req.TaskID); err != nil {
					return nil, err
				}
			}
			return s.settle(ctx, cur, rev)
		case !cur.attachable() || req.Status != TaskCancelled:
			return nil, TaskHasResult(req.TaskID)
		}
		attach = true
	}
	var output []byte
	switch {
	case req.Output != nil:
		output = []byte(*req.Output)
	case req.OutputAppended && size <= MaxInlineOutput:
		if output, err = s.assemble(ctx, agentID, req.TaskID, parts); err != nil {
			return nil, err
		}
	}
	preview, ref, outSize := string(output), "", int64(len(output))
	switch {
	case req.OutputAppended && size > MaxInlineOutput:
		// Streamed part by part: memory does not grow with the output.
		ref, outSize = agentID+"/"+req.TaskID+"/"+hash, size
		if preview, err = s.streamOutput(ctx, agentID, req.TaskID, parts, size, ref); err != nil {
			return nil, err
		}
	case len(output) > MaxInlineOutput || !utf8.Valid(output):
		if req.Output != nil { // appended output was admitted part by part
			if err := s.admitOutput(agentID, int64(len(output))); err != nil {
				return nil, err
			}
		}
		ref = agentID + "/" + req.TaskID + "/" + hash
		if err := s.putOutput(ctx, ref, int64(len(output)), func() io.Reader { return bytes.NewReader(output) }); err != nil {
			return nil, err
		}
		preview = Preview(output)
	}
	if !attach { // a cancelled task's delivery was announced by the cancel
		if err := s.announce(ctx, agentID, req.TaskID); err != nil {
			return nil, err
		}
	}
	at := s.now().UTC()
	t, rev, err := s.update(ctx, agentID, req.TaskID, true, func(t *Task) (bool, error) {
		switch {
		case t.Finished() && (t.ResultHash == hash || t.AttachHash == hash):
			return false, nil
		case t.Finished() && t.attachable() && req.Status == TaskCancelled:
			// The status, its time and its delivery stay the cancel's.
			t.ExitCode, t.Error = req.ExitCode, req.Error
			t.Output, t.OutputSize, t.OutputRef, t.AttachHash = preview, outSize, ref, hash
			return true, nil
		case t.Finished():
			return false, TaskHasResult(req.TaskID)
		}
		if t.ID == "" { // registered by this result
			t.ID, t.AgentID, t.CreatedAt = req.TaskID, agentID, at
		}
		t.Status, t.EndedAt, t.ExitCode, t.Error = req.Status, &at, req.ExitCode, req.Error
		t.Output, t.OutputSize, t.OutputRef, t.ResultHash = preview, outSize, ref, hash
		return true, nil
	}, cur, rev)
	if err != nil {
		if ref != "" && errors.Is(err, ErrTaskHasResult) {
			s.dropOutput(ctx, ref) // a concurrent, different result won
		}
		return nil, err
	}
	if req.OutputAppended {
		s.dropChunks(ctx, agentID, req.TaskID, parts)
	}
	return s.settle(ctx, t, rev)
}

// Cancel marks a running task cancelled and delivers that as its result.
// Cancelling a finished task answers it unchanged.
func (s *Store) Cancel(ctx context.Context, agentID, taskID string) (*Task, error) {
	cur, rev, err := s.getRev(ctx, agentID, taskID)
	if err != nil {
		return nil, err
	}
	if cur.DeliveredAt == nil {
		if err := s.announce(ctx, agentID, taskID); err != nil {
			return nil, err
		}
	}
	t, rev, err := s.update(ctx, agentID, taskID, false, func(t *Task) (bool, error) {
		if t.Finished() {
			return false, nil
		}
		at := s.now().UTC()
		t.Status, t.EndedAt, t.ResultHash = TaskCancelled, &at, cancelHash
		return true, nil
	}, cur, rev)
	if err != nil {
		return nil, err
	}
	return s.settle(ctx, t, rev)
}

// cancelHash marks a result chime made on a cancel: no executor's result
// matches it.
const cancelHash = "cancel"

// settle completes a finished task's delivery: the owner key is given
// the record's retention, the envelope stored, delivered_at written.
// Every step is idempotent, so any caller on any replica may repeat it.
// rev is t's revision (0: unknown).
func (s *Store) settle(ctx context.Context, t *Task, rev uint64) (*Task, error) {
	if !t.Finished() || t.DeliveredAt != nil {
		return t, nil
	}
	if _, _, err := kvrec.Update(ctx, s.kv, ownerKey(t.ID), false, func(o *owner) (bool, error) {
		if o.Finished || o.AgentID != t.AgentID {
			return false, nil
		}
		o.Finished = true
		return true, nil
	}, kvrec.ExpireFinished(s.retention, func(o *owner) bool { return o.Finished })); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("tasks: finish owner of %s: %w", t.ID, err)
	}
	env := TaskResultEnvelope(t, t.CancelledByChime())
	ack, err := s.inbox.DeliverOnce(ctx, &env, *t.EndedAt)
	if err != nil {
		// Stored but not delivered: its work item (or the caller's
		// retry) delivers.
		return nil, fmt.Errorf("tasks: deliver the result of %s: %w", t.ID, err)
	}
	at := s.now().UTC()
	out, _, err := s.update(ctx, t.AgentID, t.ID, false, func(t *Task) (bool, error) {
		if t.DeliveredAt != nil {
			return false, nil
		}
		t.DeliveredAt = &at
		t.ResultSeq = ack.Sequence // a duplicate's ack names the stored original
		return true, nil
	}, t, rev)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Append stores chunk seq of a running task's output. Chunks go in
// order: seq must be the next one, or an earlier one sent again with the
// same data (a retry, answered as accepted).
func (s *Store) Append(ctx context.Context, agentID string, req *AppendOutputRequest) (*AppendOutputReply, error) {
	t, rev, err := s.getRev(ctx, agentID, req.TaskID)
	if err != nil {
		return nil, err
	}
	seq := *req.Seq
	reply := func(t *Task) *AppendOutputReply {
		return &AppendOutputReply{TaskID: t.ID, NextSeq: t.AppendedParts, Bytes: t.AppendedBytes}
	}
	switch {
	case t.Finished() && !t.attachable():
		return nil, TaskHasResult(req.TaskID)
	case seq < t.AppendedParts:
		e, err := s.kv.Get(ctx, chunkKey(agentID, req.TaskID, seq))
		if err == nil && bytes.Equal(e.Value(), req.Data) {
			return reply(t), nil
		}
		return nil, &subjects.Error{Code: subjects.CodeConflict, Message: fmt.Sprintf("output chunk %d of task %s was stored with other data", seq, req.TaskID)}
	case seq > t.AppendedParts:
		return nil, &subjects.Error{Code: CodeTaskOutputOrder, Message: fmt.Sprintf("output chunk %d of task %s is out of order: the next is %d", seq, req.TaskID, t.AppendedParts)}
	case t.AppendedBytes+int64(len(req.Data)) > MaxTaskOutput:
		return nil, &subjects.Error{Code: subjects.CodePayloadTooLarge, Message: fmt.Sprintf("task output larger than %d MiB", MaxTaskOutput>>20)}
	}
	if err := s.admitOutput(agentID, int64(len(req.Data))); err != nil {
		return nil, err
	}
	// The record does not count this chunk yet, so writing it over a
	// lost earlier attempt is safe; it expires with the retention if the
	// task never finishes.
	if err := s.putChunk(ctx, chunkKey(agentID, req.TaskID, seq), req.Data); err != nil {
		return nil, err
	}
	t, _, err = s.update(ctx, agentID, req.TaskID, false, func(t *Task) (bool, error) {
		switch {
		case t.Finished() && !t.attachable():
			return false, TaskHasResult(req.TaskID)
		case t.AppendedParts != seq:
			return false, nil // counted by a concurrent retry
		}
		t.AppendedParts, t.AppendedBytes = seq+1, t.AppendedBytes+int64(len(req.Data))
		return true, nil
	}, t, rev)
	if err != nil {
		return nil, err
	}
	return reply(t), nil
}

// putChunk writes a chunk, with the records' retention as its TTL.
func (s *Store) putChunk(ctx context.Context, key string, data []byte) error {
	m := &nats.Msg{Subject: "$KV." + s.kv.Bucket() + "." + key, Data: data}
	var opts []jetstream.PublishOpt
	if s.retention.After > 0 {
		opts = append(opts, jetstream.WithMsgTTL(s.retention.After))
	}
	if _, err := s.js.PublishMsg(ctx, m, opts...); err != nil {
		return fmt.Errorf("tasks: store output chunk %s: %w", key, err)
	}
	return nil
}

// assemble reads the appended chunks 0..parts-1 of a small output
// (at most subjects.MaxInlineOutput bytes) into memory.
func (s *Store) assemble(ctx context.Context, agentID, taskID string, parts int64) ([]byte, error) {
	return io.ReadAll(s.chunks(ctx, agentID, taskID, parts))
}

// chunks reads the appended chunks 0..parts-1 in order, one at a time.
func (s *Store) chunks(ctx context.Context, agentID, taskID string, parts int64) *chunkReader {
	return &chunkReader{ctx: ctx, kv: s.kv, agentID: agentID, taskID: taskID, parts: parts}
}

// chunkReader is an output read chunk record by chunk record: it holds one
// chunk at a time. A Read fills p whole unless the output ends, so that
// the object store, which stores each Read as one of its chunks, stores
// full chunks (readChunks relies on it).
type chunkReader struct {
	ctx             context.Context
	kv              jetstream.KeyValue
	agentID, taskID string
	parts, next     int64
	buf             []byte // the unread rest of the current chunk
}

func (r *chunkReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if len(r.buf) == 0 {
			if r.next == r.parts {
				if n == 0 {
					return 0, io.EOF
				}
				return n, nil
			}
			e, err := r.kv.Get(r.ctx, chunkKey(r.agentID, r.taskID, r.next))
			if err != nil {
				return n, fmt.Errorf("tasks: read output chunk %d of %s: %w", r.next, r.taskID, err)
			}
			r.buf, r.next = e.Value(), r.next+1
		}
		c := copy(p[n:], r.buf)
		r.buf, n = r.buf[c:], n+c
	}
	return n, nil
}

// streamOutput stores the appended output of size bytes under ref,
// streamed from its chunks into the object store, and returns its
// preview, read from its first chunks.
func (s *Store) streamOutput(ctx context.Context, agentID, taskID string, parts, size int64, ref string) (string, error) {
	// One byte past the preview tells Preview where a character ends.
	head, err := io.ReadAll(io.LimitReader(s.chunks(ctx, agentID, taskID, parts), OutputPreview+1))
	if err != nil {
		return "", err
	}
	if err := s.putOutput(ctx, ref, size, func() io.Reader { return s.chunks(ctx, agentID, taskID, parts) }); err != nil {
		return "", err
	}
	return Preview(head), nil
}

// dropChunks removes the chunks of an assembled output; best effort, as
// they expire anyway.
func (s *Store) dropChunks(ctx context.Context, agentID, taskID string, parts int64) {
	for seq := range parts {
		if err := s.retention.Purge(ctx, s.kv, chunkKey(agentID, taskID, seq)); err != nil {
			s.log.Debug("output chunk not removed", "task_id", taskID, "seq", seq, "err", err)
			return
		}
	}
}

// putOutput stores a whole output of size bytes, read from what open
// returns, under ref, unless an earlier attempt of the same result did
// (ref holds the result's hash). An object of another size (chunks not
// as counted) is removed and refused.
func (s *Store) putOutput(ctx context.Context, ref string, size int64, open func() io.Reader) error {
	if info, err := s.outputs.GetInfo(ctx, ref); err == nil && info.Size == uint64(size) {
		return nil
	}
	info, err := s.outputs.Put(ctx, jetstream.ObjectMeta{Name: ref}, open())
	if err != nil {
		return fmt.Errorf("tasks: store output %s: %w", ref, err)
	}
	if info.Size != uint64(size) {
		s.dropOutput(ctx, ref)
		return fmt.Errorf("tasks: store output %s: %d bytes read, %d appended", ref, info.Size, size)
	}
	return nil
}

func (s *Store) dropOutput(ctx context.Context, ref string) {
	if err := s.outputs.Delete(ctx, ref); err != nil {
		s.log.Debug("unused output not removed", "output_ref", ref, "err", err)
	}
}

// Output reads limit bytes of a task's output from offset.
func (s *Store) Output(ctx context.Context, agentID string, r *OutputRange) (*TaskOutputReply, error) {
	t, err := s.get(ctx, agentID, r.TaskID)
	if err != nil {
		return nil, err
	}
	reply := &TaskOutputReply{TaskID: t.ID, Offset: r.Offset, Size: t.OutputSize, Data: []byte{}}
	if t.OutputRef == "" {
		out := []byte(t.Output)
		if r.Offset < int64(len(out)) {
			reply.Data = out[r.Offset:min(int64(len(out)), r.Offset+r.Limit)]
		}
	} else {
		if reply.Data, err = s.readObject(ctx, t.OutputRef, r.Offset, r.Limit); err != nil {
			return nil, err
		}
	}
	reply.EOF = r.Offset+int64(len(reply.Data)) >= t.OutputSize
	return reply, nil
}

// readObject reads a range of a stored output. It fetches only the
// chunks that hold the range (see readChunks); an object whose chunks it
// cannot place is read from its start, the bytes before offset skipped.
func (s *Store) readObject(ctx context.Context, ref string, offset, limit int64) ([]byte, error) {
	info, err := s.outputs.GetInfo(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("tasks: read output %s: %w", ref, err)
	}
	data, ok, err := s.readChunks(ctx, info, offset, limit)
	if err != nil {
		return nil, fmt.Errorf("tasks: read output %s: %w", ref, err)
	}
	if ok {
		return data, nil
	}
	obj, err := s.outputs.Get(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("tasks: read output %s: %w", ref, err)
	}
	defer func() { _ = obj.Close() }()
	if _, err := io.CopyN(io.Discard, obj, offset); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("tasks: read output %s: %w", ref, err)
	}
	data, err = io.ReadAll(io.LimitReader(obj, limit))
	if err != nil {
		return nil, fmt.Errorf("tasks: read output %s: %w", ref, err)
	}
	return data, nil
}

// defaultChunkSize is the object store's chunk size when an object's info
// names none (nats.go's objDefaultChunkSize).
const defaultChunkSize = 128 << 10

// readChunks reads a range of an object by fetching the chunks that hold
// it, so a range costs what it reads, not what precedes it. The object
// store keeps an object as messages on $O.<bucket>.C.<nuid>, in order,
// each ChunkSize bytes but the last (putOutput writes from a bytes.Reader,
// whose reads fill each chunk). Chunk k is the k-th message on that
// subject: when the first and last chunks are Chunks-1 sequences apart no
// other message is between them and chunk k is at first+k; otherwise (two
// objects stored at the same moment) the chunks' sequences are listed
// from their headers alone. ok is false when the chunks are not as
// expected (the caller reads the object whole). The digest covers the
// whole object: a range is not checked against it.
func (s *Store) readChunks(ctx context.Context, info *jetstream.ObjectInfo, offset, limit int64) (_ []byte, ok bool, _ error) {
	size := int64(defaultChunkSize)
	if info.Opts != nil && info.Opts.ChunkSize > 0 {
		size = int64(info.Opts.ChunkSize)
	}
	if offset >= int64(info.Size) || info.Chunks == 0 {
		return []byte{}, true, nil
	}
	st, err := s.js.Stream(ctx, "OBJ_"+info.Bucket)
	if err != nil {
		return nil, false, err
	}
	subject := "$O." + info.Bucket + ".C." + info.NUID
	first, err := st.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subject))
	if err != nil {
		return nil, false, err
	}
	last, err := st.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		return nil, false, err
	}
	chunks := int64(info.Chunks)
	seqOf := func(k int64) uint64 { return first.Sequence + uint64(k) }
	if last.Sequence-first.Sequence != uint64(chunks-1) {
		// Listed once an object: a reader asks range after range.
		seqs, ok := s.seqs.get(info.NUID)
		if !ok || len(seqs) != int(chunks) {
			if seqs, err = chunkSeqs(ctx, st, subject, first.Sequence, int(chunks)); err != nil {
				return nil, false, err
			}
			s.seqs.put(info.NUID, seqs)
		}
		seqOf = func(k int64) uint64 { return seqs[k] }
	}
	out := make([]byte, 0, min(limit, int64(info.Size)-offset))
	for k := offset / size; k < chunks && int64(len(out)) < limit; k++ {
		m, err := st.GetMsg(ctx, seqOf(k))
		if err != nil {
			return nil, false, err
		}
		if m.Subject != subject || (k < chunks-1 && int64(len(m.Data)) != size) {
			return nil, false, nil
		}
		data := m.Data
		if k == offset/size {
			data = data[min(offset%size, int64(len(data))):]
		}
		out = append(out, data[:min(int64(len(data)), limit-int64(len(out)))]...)
	}
	return out, true, nil
}

// seqCache keeps the chunk sequences of the objects last listed (see
// readChunks), by object NUID, which a new put of a name changes: a
// chunk list is 8 bytes a chunk, 4 KiB for a 64 MiB output.
type seqCache struct {
	mu   sync.Mutex
	objs map[string][]uint64
}

// seqCacheSize bounds the objects whose chunks are kept.
const seqCacheSize = 64

func (c *seqCache) get(nuid string) ([]uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	seqs, ok := c.objs[nuid]
	return seqs, ok
}

func (c *seqCache) put(nuid string, seqs []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.objs == nil {
		c.objs = map[string][]uint64{}
	}
	for k := range c.objs { // any one goes: a miss costs one listing
		if len(c.objs) < seqCacheSize {
			break
		}
		delete(c.objs, k)
	}
	c.objs[nuid] = seqs
}

// chunkSeqs lists the stream sequences of the n chunks on subject from
// sequence from, reading their headers alone.
func chunkSeqs(ctx context.Context, st jetstream.Stream, subject string, from uint64, n int) ([]uint64, error) {
	c, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject}, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from, HeadersOnly: true,
	})
	if err != nil {
		return nil, err
	}
	seqs := make([]uint64, 0, n)
	for len(seqs) < n {
		batch, err := c.Fetch(n-len(seqs), jetstream.FetchContext(ctx))
		if err != nil {
			return nil, err
		}
		got := len(seqs)
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				return nil, err
			}
			seqs = append(seqs, md.Sequence.Stream)
		}
		if err := batch.Error(); err != nil {
			return nil, err
		}
		if len(seqs) == got {
			return nil, fmt.Errorf("chunks of %s: %d of %d listed", subject, got, n)
		}
	}
	return seqs, nil
}
