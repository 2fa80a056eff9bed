package tasks_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
)

type env struct {
	store *tasks.Store
	res   *engine.Resources
}

func newEnv(t testing.TB) *env {
	t.Helper()
	_, res := natstest.Provisioned(t, natstest.Server(t))
	inbox := consumer.NewInbox(res.JS, engine.InboxStream, 2*time.Minute, nil)
	return &env{res: res, store: tasks.NewStore(tasks.Config{
		KV: res.Tasks, Outputs: res.TaskOutputs, Inbox: inbox, JS: res.JS,
		Retention: kvrec.Retention{JS: res.JS, After: time.Hour, Markers: time.Minute},
	})}
}

// results reads the agent's task_result envelopes from the inbox stream.
func (e *env) results(t testing.TB, agentID string) []subjects.Envelope {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := e.res.JS.OrderedConsumer(ctx, engine.InboxStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subjects.Inbox(agentID)}})
	if err != nil {
		t.Fatal(err)
	}
	var out []subjects.Envelope
	for left := c.CachedInfo().NumPending; left > 0; left-- {
		m, err := c.Next(jetstream.FetchMaxWait(2 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var env subjects.Envelope
		if err := json.Unmarshal(m.Data(), &env); err != nil {
			t.Fatal(err)
		}
		if env.Kind == subjects.KindTaskResult {
			out = append(out, env)
		}
	}
	return out
}

func text(s string) *string { return &s }

func code(err error) string {
	var e *subjects.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return fmt.Sprintf("not a wire error: %v", err)
}

func TestResultDeliveredOnceAndRetriesIdempotent(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	started, err := e.store.Start(ctx, "a1", &tasks.StartTaskRequest{TaskID: "build", Title: "make"})
	if err != nil || started.Status != tasks.TaskRunning {
		t.Fatalf("start: %+v %v", started, err)
	}
	exit := 3
	req := &tasks.TaskResultRequest{TaskID: "build", Status: tasks.TaskFailed, Output: text("hi\n"), ExitCode: &exit}
	first, err := e.store.Result(ctx, "a1", req)
	if err != nil || first.Status != tasks.TaskFailed || first.DeliveredAt == nil || first.Output != "hi\n" {
		t.Fatalf("result: %+v %v", first, err)
	}
	again, err := e.store.Result(ctx, "a1", req)
	if err != nil || again.ResultHash != first.ResultHash {
		t.Fatalf("identical retry: %+v %v", again, err)
	}
	other := *req
	other.Status = tasks.TaskCompleted
	if _, err := e.store.Result(ctx, "a1", &other); code(err) != tasks.CodeTaskHasResult || !strings.Contains(err.Error(), "task build already has a result") {
		t.Fatalf("second result: %v", err)
	}
	got := e.results(t, "a1")
	if len(got) != 1 || got[0].ID != "task_build_result" || got[0].Trust != subjects.TrustExternal {
		t.Fatalf("deliveries: %+v", got)
	}
	var data tasks.TaskResultData
	if err := json.Unmarshal(got[0].Data, &data); err != nil || data.Status != tasks.TaskFailed || *data.ExitCode != 3 || data.Output != "hi\n" {
		t.Fatalf("data: %+v %v", data, err)
	}
}

func TestConcurrentReportersDeliverOnce(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	req := &tasks.TaskResultRequest{TaskID: "t1", Status: tasks.TaskCompleted, Output: text(strings.Repeat("x", 20<<10))}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			_, err := e.store.Result(ctx, "a1", req)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := e.results(t, "a1"); len(got) != 1 {
		t.Fatalf("%d deliveries, want 1", len(got))
	}
	out, err := e.store.Output(ctx, "a1", &tasks.OutputRange{TaskID: "t1", Limit: tasks.MaxOutputRead})
	if err != nil || len(out.Data) != 20<<10 || !out.EOF {
		t.Fatalf("output: %d bytes, eof %v, %v", len(out.Data), out.EOF, err)
	}
}

func TestAnotherAgentsTaskRefusedNothingStored(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.store.Start(ctx, "a1", &tasks.StartTaskRequest{TaskID: "mine"}); err != nil {
		t.Fatal(err)
	}
	_, err := e.store.Result(ctx, "a2", &tasks.TaskResultRequest{TaskID: "mine", Status: tasks.TaskCompleted})
	if code(err) != tasks.CodeTaskOwned || !strings.Contains(err.Error(), "task mine belongs to another agent") {
		t.Fatalf("result of another's task: %v", err)
	}
	if _, err := e.store.Start(ctx, "a2", &tasks.StartTaskRequest{TaskID: "mine"}); code(err) != tasks.CodeTaskOwned {
		t.Fatalf("start of another's task: %v", err)
	}
	for _, f := range []func() error{
		func() error { _, err := e.store.Get(ctx, "a2", "mine"); return err },
		func() error { _, err := e.store.Cancel(ctx, "a2", "mine"); return err },
	} {
		if err := f(); code(err) != tasks.CodeTaskOwned {
			t.Fatalf("get/cancel of another's task: %v", err)
		}
	}
	if l, _, err := e.store.List(ctx, "a2", 10, subjects.CursorPos{}); err != nil || len(l) != 0 {
		t.Fatalf("a2 has %v %v", l, err)
	}
	if got := e.results(t, "a2"); len(got) != 0 {
		t.Fatalf("a2 deliveries: %+v", got)
	}
	mine, err := e.store.Get(ctx, "a1", "mine")
	if err != nil || mine.Status != tasks.TaskRunning {
		t.Fatalf("a1's task changed: %+v %v", mine, err)
	}
}

func TestCancelDeliversCancelled(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.store.Start(ctx, "a1", &tasks.StartTaskRequest{TaskID: "long"}); err != nil {
		t.Fatal(err)
	}
	c, err := e.store.Cancel(ctx, "a1", "long")
	if err != nil || c.Status != tasks.TaskCancelled {
		t.Fatalf("cancel: %+v %v", c, err)
	}
	if _, err := e.store.Cancel(ctx, "a1", "long"); err != nil {
		t.Fatalf("second cancel: %v", err)
	}
	_, err = e.store.Result(ctx, "a1", &tasks.TaskResultRequest{TaskID: "long", Status: tasks.TaskCompleted})
	if code(err) != tasks.CodeTaskHasResult {
		t.Fatalf("result after cancel: %v", err)
	}
	got := e.results(t, "a1")
	if len(got) != 1 || got[0].Trust != subjects.TrustSystem || !strings.Contains(got[0].Text, "cancelled") {
		t.Fatalf("deliveries: %+v", got)
	}
	if _, err := e.store.Cancel(ctx, "a1", "nope"); code(err) != tasks.CodeTaskNotFound {
		t.Fatalf("cancel unknown: %v", err)
	}
}

// TestCancelledTaskKeepsItsOutput: after a cancel, the executor that was
// running the command stores what it printed until it stopped it (chunks,
// then one result with status cancelled): the status, its time and the one
// delivery stay the cancel's, the output and exit code are added, a retry
// of that result is answered unchanged, and anything else is refused.
func TestCancelledTaskKeepsItsOutput(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.store.Start(ctx, "a1", &tasks.StartTaskRequest{TaskID: "sleepy"}); err != nil {
		t.Fatal(err)
	}
	appendAll(t, e.store, "a1", "sleepy", []byte("before the cancel\n"))
	cancelled, err := e.store.Cancel(ctx, "a1", "sleepy")
	if err != nil || cancelled.Status != tasks.TaskCancelled || !cancelled.CancelledByChime() {
		t.Fatalf("cancel: %+v %v", cancelled, err)
	}
	seq := int64(1)
	if _, err := e.store.Append(ctx, "a1", &tasks.AppendOutputRequest{TaskID: "sleepy", Seq: &seq, Data: []byte("while stopping\n")}); err != nil {
		t.Fatalf("append after the cancel: %v", err)
	}
	if _, err := e.store.Result(ctx, "a1", &tasks.TaskResultRequest{TaskID: "sleepy", Status: tasks.TaskCompleted, OutputAppended: true}); code(err) != tasks.CodeTaskHasResult {
		t.Fatalf("a completed result after the cancel: %v", err)
	}
	exit := 143
	attach := &tasks.TaskResultRequest{TaskID: "sleepy", Status: tasks.TaskCancelled, ExitCode: &exit, Error: "stopped: cancelled", OutputAppended: true}
	got, err := e.store.Result(ctx, "a1", attach)
	if err != nil || got.Status != tasks.TaskCancelled || got.Output != "before the cancel\nwhile stopping\n" || got.ExitCode == nil || *got.ExitCode != 143 ||
		!got.EndedAt.Equal(*cancelled.EndedAt) || !got.CancelledByChime() {
		t.Fatalf("attach: %+v %v", got, err)
	}
	if again, err := e.store.Result(ctx, "a1", attach); err != nil || again.AttachHash != got.AttachHash || again.Output != got.Output {
		t.Fatalf("attach retried: %+v %v", again, err)
	}
	other := *attach
	other.Error = "another"
	if _, err := e.store.Result(ctx, "a1", &other); code(err) != tasks.CodeTaskHasResult {
		t.Fatalf("a second attach: %v", err)
	}
	seq = 2
	if _, err := e.store.Append(ctx, "a1", &tasks.AppendOutputRequest{TaskID: "sleepy", Seq: &seq, Data: []byte("late")}); code(err) != tasks.CodeTaskHasResult {
		t.Fatalf("append after the attach: %v", err)
	}
	if res := e.results(t, "a1"); len(res) != 1 || res[0].Trust != subjects.TrustSystem {
		t.Fatalf("deliveries: %+v", res)
	}
	// A task its executor finished is not attachable.
	if _, err := e.store.Result(ctx, "a1", &tasks.TaskResultRequest{TaskID: "done", Status: tasks.TaskCompleted}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Result(ctx, "a1", &tasks.TaskResultRequest{TaskID: "done", Status: tasks.TaskCancelled}); code(err) != tasks.CodeTaskHasResult {
		t.Fatalf("cancelled over completed: %v", err)
	}
}

// TestAppendedOutputRoundTrip: 1 MiB appended in chunks (one sent twice)
// lands in the object store and reads back whole.
func TestAppendedOutputRoundTrip(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	want := make([]byte, 1<<20)
	for i := range want {
		want[i] = byte(i * 7)
	}
	if _, err := e.store.Start(ctx, "a1", &tasks.StartTaskRequest{TaskID: "big"}); err != nil {
		t.Fatal(err)
	}
	appendAll(t, e.store, "a1", "big", want)
	seq := int64(0)
	if _, err := e.store.Append(ctx, "a1", &tasks.AppendOutputRequest{TaskID: "big", Seq: &seq, Data: want[:tasks.MaxAppendChunk]}); err != nil {
		t.Fatalf("retried chunk: %v", err)
	}
	if _, err := e.store.Append(ctx, "a1", &tasks.AppendOutputRequest{TaskID: "big", Seq: &seq, Data: []byte("other")}); code(err) != subjects.CodeConflict {
		t.Fatalf("changed chunk: %v", err)
	}
	gap := int64(999)
	if _, err := e.store.Append(ctx, "a1", &tasks.AppendOutputRequest{TaskID: "big", Seq: &gap, Data: []byte("x")}); code(err) != tasks.CodeTaskOutputOrder {
		t.Fatalf("gap: %v", err)
	}
	task, err := e.store.Result(ctx, "a1", &tasks.TaskResultRequest{TaskID: "big", Status: tasks.TaskCompleted, OutputAppended: true})
	if err != nil || task.OutputRef == "" || task.OutputSize != 1<<20 || len(task.Output) > tasks.OutputPreview {
		t.Fatalf("result: ref %q size %d preview %d, %v", task.OutputRef, task.OutputSize, len(task.Output), err)
	}
	if got := readAll(t, e.store, "a1", "big"); !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, not the %d appended", len(got), len(want))
	}
}

func appendAll(t testing.TB, s *tasks.Store, agentID, taskID string, data []byte) {
	t.Helper()
	for seq := int64(0); len(data) > 0; seq++ {
		n := min(len(data), tasks.MaxAppendChunk)
		if _, err := s.Append(context.Background(), agentID, &tasks.AppendOutputRequest{TaskID: taskID, Seq: &seq, Data: data[:n]}); err != nil {
			t.Fatalf("append %d: %v", seq, err)
		}
		data = data[n:]
	}
}

func readAll(t testing.TB, s *tasks.Store, agentID, taskID string) []byte {
	t.Helper()
	var out []byte
	for {
		r, err := s.Output(context.Background(), agentID, &tasks.OutputRange{TaskID: taskID, Offset: int64(len(out)), Limit: tasks.MaxOutputRead})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r.Data...)
		if r.EOF {
			return out
		}
	}
}

// BenchmarkOutput10MiB stores a 10 MiB output (appended, assembled into
// the object store) and reads it back, reporting each in MB/s.
func BenchmarkOutput10MiB(b *testing.B) {
	e := newEnv(b)
	data := bytes.Repeat([]byte("0123456789abcdef"), 10<<20/16)
	var store, read time.Duration
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("bench%d", i)
		start := time.Now()
		if _, err := e.store.Start(context.Background(), "a1", &tasks.StartTaskRequest{TaskID: id}); err != nil {
			b.Fatal(err)
		}
		appendAll(b, e.store, "a1", id, data)
		if _, err := e.store.Result(context.Background(), "a1", &tasks.TaskResultRequest{TaskID: id, Status: tasks.TaskCompleted, OutputAppended: true}); err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		if got := readAll(b, e.store, "a1", id); len(got) != len(data) {
			b.Fatalf("read %d bytes", len(got))
		}
		store, read = store+mid.Sub(start), read+time.Since(mid)
	}
	mb := float64(len(data)) * float64(b.N) / 1e6
	b.ReportMetric(mb/store.Seconds(), "store_MB/s")
	b.ReportMetric(mb/read.Seconds(), "read_MB/s")
}

// interleaving is a reader that, before its second read, stores another
// object: that object's chunks fall between this one's in the stream.
type interleaving struct {
	r     io.Reader
	reads int
	other func()
}

func (i *interleaving) Read(p []byte) (int, error) {
	if i.reads++; i.reads == 2 {
		i.other()
	}
	return i.r.Read(p)
}

// shortReads fills no chunk: each read returns at most 1000 bytes.
type shortReads struct{ r io.Reader }

func (s shortReads) Read(p []byte) (int, error) { return s.r.Read(p[:min(len(p), 1000)]) }

// TestOutputRanges: ranges of a 1 MiB output at offsets inside, at and
// across chunk boundaries read back exactly, whether the output's chunks
// are contiguous in the stream, interleaved with another object's, or not
// of the chunk size (read whole, as before).
func TestOutputRanges(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	want := make([]byte, 1<<20+123)
	for i := range want {
		want[i] = byte(i*31 + i>>11)
	}
	if _, err := e.store.Start(ctx, "a1", &tasks.StartTaskRequest{TaskID: "ranges"}); err != nil {
		t.Fatal(err)
	}
	appendAll(t, e.store, "a1", "ranges", want)
	task, err := e.store.Result(ctx, "a1", &tasks.TaskResultRequest{TaskID: "ranges", Status: tasks.TaskCompleted, OutputAppended: true})
	if err != nil || task.OutputRef == "" {
		t.Fatalf("result: %+v %v", task, err)
	}
	const chunk = 128 << 10
	check := func(layout string) {
		t.Helper()
		for _, r := range [][2]int64{
			{0, 10}, {0, tasks.MaxOutputRead}, {chunk - 1, 2}, {chunk, chunk}, {3*chunk + 5, 2*chunk + 7},
			{int64(len(want)) - 100, 1000}, {int64(len(want)), 10}, {5, 1},
		} {
			got, err := e.store.Output(ctx, "a1", &tasks.OutputRange{TaskID: "ranges", Offset: r[0], Limit: r[1]})
			if err != nil {
				t.Fatalf("%s: range %v: %v", layout, r, err)
			}
			end := min(int64(len(want)), r[0]+r[1])
			if !bytes.Equal(got.Data, want[min(r[0], end):end]) || got.EOF != (end == int64(len(want))) {
				t.Fatalf("%s: range %v read %d bytes (eof %v), not want[%d:%d]", layout, r, len(got.Data), got.EOF, r[0], end)
			}
		}
		if got := readAll(t, e.store, "a1", "ranges"); !bytes.Equal(got, want) {
			t.Fatalf("%s: read whole, %d bytes differ", layout, len(got))
		}
	}
	check("contiguous")

	// The same output stored again (a new object under the same name), its
	// chunks interleaved with another object's.
	put := func(r io.Reader) {
		t.Helper()
		if _, err := e.res.TaskOutputs.Put(ctx, jetstream.ObjectMeta{Name: task.OutputRef}, r); err != nil {
			t.Fatal(err)
		}
	}
	put(&interleaving{r: bytes.NewReader(want), other: func() {
		if _, err := e.res.TaskOutputs.PutBytes(ctx, "other", bytes.Repeat([]byte("x"), 3*chunk)); err != nil {
			t.Error(err)
		}
	}})
	check("interleaved")
	put(shortReads{bytes.NewReader(want)})
	check("short chunks")
}

// TestStreamedOutputIrregularParts: outputs of several MiB appended in
// parts of uneven sizes (1 byte, odd lengths, the most), reported at once
// so their objects interleave, are streamed into the object store in full
// chunks (so a range reads only its chunks), read back byte-exact, carry
// the preview of their first bytes, and leave no chunk record behind.
func TestStreamedOutputIrregularParts(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sizes := []int{1, 4095, tasks.MaxAppendChunk, 7, 100_003, tasks.MaxAppendChunk - 1, 2}
	outputs := map[string][]byte{}
	for n, id := range []string{"s1", "s2", "s3"} {
		want := make([]byte, 3<<20+n*1001)
		for i := range want {
			want[i] = byte(i*131 + i>>13 + n) // not UTF-8
		}
		outputs[id] = want
		if _, err := e.store.Start(ctx, "a1", &tasks.StartTaskRequest{TaskID: id}); err != nil {
			t.Fatal(err)
		}
		rest := want
		for seq := int64(0); len(rest) > 0; seq++ {
			k := min(len(rest), sizes[int(seq)%len(sizes)])
			if _, err := e.store.Append(ctx, "a1", &tasks.AppendOutputRequest{TaskID: id, Seq: &seq, Data: rest[:k]}); err != nil {
				t.Fatalf("%s: append %d: %v", id, seq, err)
			}
			rest = rest[k:]
		}
	}
	var wg sync.WaitGroup
	done := map[string]*tasks.Task{}
	var mu sync.Mutex
	for id := range outputs {
		wg.Go(func() {
			task, err := e.store.Result(ctx, "a1", &tasks.TaskResultRequest{TaskID: id, Status: tasks.TaskCompleted, OutputAppended: true})
			if err != nil {
				t.Errorf("%s: result: %v", id, err)
				return
			}
			mu.Lock()
			done[id] = task
			mu.Unlock()
		})
	}
	wg.Wait()
	for id, want := range outputs {
		task := done[id]
		if task == nil {
			t.FailNow()
		}
		if task.OutputSize != int64(len(want)) || task.Output != tasks.Preview(want) {
			t.Fatalf("%s: size %d, preview of %d bytes", id, task.OutputSize, len(task.Output))
		}
		info, err := e.res.TaskOutputs.GetInfo(ctx, task.OutputRef)
		if err != nil {
			t.Fatal(err)
		}
		const chunk = 128 << 10
		if full := (len(want) + chunk - 1) / chunk; int(info.Chunks) != full || info.Size != uint64(len(want)) {
			t.Fatalf("%s: %d chunks of %d bytes, want %d full ones", id, info.Chunks, info.Size, full)
		}
		if got := readAll(t, e.store, "a1", id); !bytes.Equal(got, want) {
			t.Fatalf("%s: read %d bytes, not the %d appended", id, len(got), len(want))
		}
		got, err := e.store.Output(ctx, "a1", &tasks.OutputRange{TaskID: id, Offset: 2*chunk - 3, Limit: 10})
		if err != nil || !bytes.Equal(got.Data, want[2*chunk-3:2*chunk+7]) {
			t.Fatalf("%s: a range across a chunk boundary: %v", id, err)
		}
		if _, err := e.res.Tasks.Get(ctx, "a1."+id+".0"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("%s: the first chunk record is left: %v", id, err)
		}
	}
}

// TestStreamedOutputChunkLost: a result whose appended chunk is gone (its
// retention passed) is refused, no object is stored, the task stays
// running and its other chunks stay.
func TestStreamedOutputChunkLost(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.store.Start(ctx, "a1", &tasks.StartTaskRequest{TaskID: "lost"}); err != nil {
		t.Fatal(err)
	}
	appendAll(t, e.store, "a1", "lost", bytes.Repeat([]byte{0xff}, 200<<10))
	if err := e.res.Tasks.Purge(ctx, "a1.lost.2"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Result(ctx, "a1", &tasks.TaskResultRequest{TaskID: "lost", Status: tasks.TaskCompleted, OutputAppended: true}); err == nil {
		t.Fatal("a result with a chunk missing was stored")
	}
	if task, err := e.store.Get(ctx, "a1", "lost"); err != nil || task.Status != tasks.TaskRunning {
		t.Fatalf("task after the refused result: %+v %v", task, err)
	}
	if _, err := e.res.Tasks.Get(ctx, "a1.lost.0"); err != nil {
		t.Fatalf("chunk 0 after the refused result: %v", err)
	}
	names, err := e.res.TaskOutputs.List(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		t.Fatal(err)
	}
	if len(names) != 0 {
		t.Fatalf("objects stored: %d", len(names))
	}
}
