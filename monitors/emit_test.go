package monitors_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/monitors"
	"github.com/chime-nats/chime/subjects"
)

func emit(e *env, agentID, id string, seq int64, l ...string) (*monitors.EmitReply, error) {
	return e.store.Emit(context.Background(), agentID, &monitors.EmitRequest{MonitorID: id, Seq: &seq, Lines: l})
}

// TestEmitDeliversEachBatchOnce: each batch is one monitor_event under
// monitor_<id>_<seq>; a batch sent again is answered as a duplicate and
// stored once; a seq past the next is refused; a filtered batch delivers
// nothing; max_events stops the monitor and lines after it are refused.
func TestEmitDeliversEachBatchOnce(t *testing.T) {
	e := newEnv(t, 0)
	m := start(t, e, "a1", `{"description":"CI","command":"make","exclude":"^ok","max_events":4}`)
	r, err := emit(e, "a1", m.ID, 0, "FAIL a", "ok b", "FAIL c")
	if err != nil || r.Delivered != 2 || r.Filtered != 1 || r.NextSeq != 1 || r.Status != monitors.Running {
		t.Fatalf("batch 0: %+v %v", r, err)
	}
	if r, err := emit(e, "a1", m.ID, 0, "FAIL a", "ok b", "FAIL c"); err != nil || !r.Duplicate || r.NextSeq != 1 {
		t.Fatalf("batch 0 again: %+v %v", r, err)
	}
	if _, err := emit(e, "a1", m.ID, 5, "x"); !errors.Is(err, &subjects.Error{Code: monitors.CodeOutOfOrder}) {
		t.Fatalf("batch 5: %v", err)
	}
	if r, err := emit(e, "a1", m.ID, 1, "ok only"); err != nil || r.Delivered != 0 || r.NextSeq != 2 {
		t.Fatalf("filtered batch: %+v %v", r, err)
	}
	r, err = emit(e, "a1", m.ID, 2, "d", "e", "f")
	if err != nil || r.Delivered != 2 || r.Status != monitors.Stopped || r.StopReason != monitors.ReasonMaxEvents {
		t.Fatalf("batch 2: %+v %v", r, err)
	}
	if _, err := emit(e, "a1", m.ID, 3, "g"); !errors.Is(err, monitors.ErrMonitorStopped) || !strings.Contains(err.Error(), "stopped (max_events)") {
		t.Fatalf("after the stop: %v", err)
	}
	events := e.inbox(t, "a1", subjects.KindMonitorEvent)
	if len(events) != 2 || events[0].ID != "monitor_"+m.ID+"_0" || events[1].ID != "monitor_"+m.ID+"_2" ||
		events[0].Text != "Monitor "+m.ID+" (CI):\nFAIL a\nFAIL c" || events[0].Trust != subjects.TrustExternal {
		t.Fatalf("events: %+v", events)
	}
	stops := e.inbox(t, "a1", subjects.KindMonitorStopped)
	if len(stops) != 1 || !strings.Contains(stops[0].Text, "it delivered its max_events (4); 4 events delivered") {
		t.Fatalf("stops: %+v", stops)
	}
}

// TestSweepStopsOnTimeoutAndIdle: with the store's clock moved, a sweep
// stops a monitor past its timeout (timeout) and one that had no event
// within its idle timeout (idle_timeout); a persistent one with events
// stays.
func TestSweepStopsOnTimeoutAndIdle(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	timed := start(t, e, "a1", `{"description":"t","command":"x","timeout_ms":60000}`)
	idle := start(t, e, "a1", `{"description":"i","command":"x","persistent":true,"idle_timeout_ms":10000}`)
	busy := start(t, e, "a1", `{"description":"b","command":"x","persistent":true,"idle_timeout_ms":10000}`)
	e.now = e.now.Add(8 * time.Second)
	if _, err := emit(e, "a1", busy.ID, 0, "still here"); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 5*time.Second, func() bool { return e.index.Running("a1") == 3 })
	e.now = e.now.Add(3 * time.Second) // idle 11 s, busy idle 3 s
	testwait.Eventually(t, 5*time.Second, func() bool { return len(e.index.Due(e.now)) == 1 }, "the busy monitor's event seen by the index")
	if n, err := e.store.Sweep(ctx, e.index.Due(e.now)); err != nil || n != 1 {
		t.Fatalf("sweep at 11 s: %d %v", n, err)
	}
	e.now = e.now.Add(50 * time.Second)
	testwait.Eventually(t, 5*time.Second, func() bool { return e.index.Running("a1") == 2 })
	if n, err := e.store.Sweep(ctx, e.index.Due(e.now)); err != nil || n != 2 {
		t.Fatalf("sweep at 61 s: %d %v", n, err)
	}
	for id, reason := range map[string]string{timed.ID: monitors.ReasonTimeout, idle.ID: monitors.ReasonIdleTimeout, busy.ID: monitors.ReasonIdleTimeout} {
		m, err := e.store.Get(ctx, "a1", id)
		if err != nil || m.StopReason != reason || m.DeliveredAt == nil {
			t.Fatalf("%s: %+v %v", id, m, err)
		}
	}
	if stops := e.inbox(t, "a1", subjects.KindMonitorStopped); len(stops) != 3 {
		t.Fatalf("stops: %+v", stops)
	}
}

// TestFloodOfAThousandLinesASecond: a source sending 1,000 lines a second
// for 10 s (a batch of 100 lines every 100 ms: Gather sends a full batch
// at once) makes at most one envelope a batch, and after the burst no more
// than the bucket refills (10 lines a second): the lines let through are
// a burst of 100 and then 10 a second, the rest counted and said in
// "N events suppressed" lines; 10 s of flood is not yet a flood stop.
func TestFloodOfAThousandLinesASecond(t *testing.T) {
	e := newEnv(t, 0)
	m := start(t, e, "a1", `{"description":"firehose","command":"yes","persistent":true}`)
	var lines []string
	for i := range 100 {
		lines = append(lines, fmt.Sprintf("line %d", i))
	}
	start := e.now
	for seq := int64(0); seq < 100; seq++ {
		e.now = start.Add(time.Duration(seq) * 100 * time.Millisecond)
		r, err := emit(e, "a1", m.ID, seq, lines...)
		if err != nil || r.Status != monitors.Running {
			t.Fatalf("batch %d: %+v %v", seq, r, err)
		}
	}
	got, err := e.store.Get(context.Background(), "a1", m.ID)
	if err != nil {
		t.Fatal(err)
	}
	events := e.inbox(t, "a1", subjects.KindMonitorEvent)
	// 100 at once, then 10 a second over the 9.9 s the batches span.
	if len(events) > 100 || got.Events < 100+95 || got.Events > 100+99 || got.Events+got.Suppressed != 10000 || got.Batches != int64(len(events)) {
		t.Fatalf("%d envelopes; record %+v", len(events), got)
	}
	said := int64(0)
	for _, env := range events {
		var d monitors.EventData
		if err := json.Unmarshal(env.Data, &d); err != nil {
			t.Fatal(err)
		}
		said += d.Suppressed
	}
	if said+got.PendingSuppressed != got.Suppressed {
		t.Fatalf("suppressed said %d + pending %d, counted %d", said, got.PendingSuppressed, got.Suppressed)
	}
}

// TestBatchStoredButNotCounted: an attempt stored batch 0 and died before
// the record counted it (a nats-server killed mid-emit, a watch that
// moved). A later batch with other lines under the same seq would be
// dropped by the inbox's dedup while the record counted it: lines lost,
// events overcounted. Instead the stored batch is counted, with its
// cursor, and the later lines are refused as superseded, to go again as
// the next seq; both reach the agent once and the record agrees.
func TestBatchStoredButNotCounted(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	m := start(t, e, "a1", `{"description":"d","command":"tail -f log"}`)
	orphan := monitors.EventEnvelope(m, &monitors.Batch{Seq: 0, Lines: []string{"A1", "A2"}, Cursor: "41"}, time.Now())
	inbox := consumer.NewInbox(e.res.JS, engine.InboxStream, 2*time.Minute, nil)
	if _, err := inbox.Deliver(ctx, &orphan); err != nil {
		t.Fatal(err)
	}
	seq := int64(0)
	r, err := e.store.Emit(ctx, "a1", &monitors.EmitRequest{MonitorID: m.ID, Seq: &seq, Lines: []string{"B1", "B2", "B3"}})
	if err != nil || !r.Superseded || r.NextSeq != 1 || r.Delivered != 0 {
		t.Fatalf("emit over the stored batch: %+v %v", r, err)
	}
	rec, err := e.store.Get(ctx, "a1", m.ID)
	if err != nil || rec.Events != 2 || rec.Batches != 1 || rec.NextSeq != 1 || rec.Cursor != "41" {
		t.Fatalf("record after the adoption: %+v %v", rec, err)
	}
	seq = 1
	if r, err = e.store.Emit(ctx, "a1", &monitors.EmitRequest{MonitorID: m.ID, Seq: &seq, Lines: []string{"B1", "B2", "B3"}}); err != nil || r.Delivered != 3 || r.Superseded {
		t.Fatalf("the lines again as the next seq: %+v %v", r, err)
	}
	var lines []string
	for _, env := range e.inbox(t, "a1", subjects.KindMonitorEvent) {
		var d monitors.EventData
		if err := json.Unmarshal(env.Data, &d); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, d.Lines...)
	}
	if got := strings.Join(lines, ","); got != "A1,A2,B1,B2,B3" {
		t.Fatalf("the agent has %s", got)
	}
	if rec, _ = e.store.Get(ctx, "a1", m.ID); rec.Events != 5 || rec.Batches != 2 {
		t.Fatalf("record: %+v", rec)
	}
	// The same batch sent again after its store (a retry) is not superseded.
	seq = 2
	req := &monitors.EmitRequest{MonitorID: m.ID, Seq: &seq, Lines: []string{"C"}}
	retry := monitors.EventEnvelope(rec, &monitors.Batch{Seq: 2, Lines: []string{"C"}}, time.Now())
	if _, err := inbox.Deliver(ctx, &retry); err != nil {
		t.Fatal(err)
	}
	if r, err = e.store.Emit(ctx, "a1", req); err != nil || r.Superseded || r.Delivered != 1 || r.NextSeq != 3 {
		t.Fatalf("a retry of the stored batch: %+v %v", r, err)
	}
}
