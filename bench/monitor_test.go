package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/chime-nats/chime/monitors"
	"github.com/chime-nats/chime/subjects"
)

// TestMonitor runs the monitor benchmark for a few seconds on real
// nats-server and chime processes: every line of the latency phase is
// received once from each source, and the flood's counts add up between
// what the agent got and the monitor's record. The figures are not
// checked.
func TestMonitor(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nats-server and chime processes")
	}
	exe := chimeBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	res, err := Monitor(ctx, MonitorOptions{Rate: 5, Duration: 2 * time.Second, FloodRate: 500, Flood: 3 * time.Second, Grace: 3 * time.Second,
		Exe: exe, Progress: &progress})
	if err != nil {
		t.Fatalf("Monitor: %v\n%s", err, progress.String())
	}
	var text bytes.Buffer
	res.WriteText(&text)
	t.Logf("%s", text.String())
	if err := res.Err(); err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	if len(res.Latency) != 3 {
		t.Fatalf("latency rows: %+v", res.Latency)
	}
	for _, l := range res.Latency {
		if l.Sent != 10 || l.Received != 10 || l.Envelopes == 0 || l.Suppressed != 0 || l.LatencyMs.Max <= 0 {
			t.Errorf("%s: %+v", l.Source, l)
		}
	}
	f := res.Flood
	if f == nil || f.Published == 0 || f.Envelopes == 0 || f.Lines > f.Published || int64(f.Envelopes) != f.Batches ||
		f.Lines != f.Events || f.SuppressedSaid+f.PendingSuppressed != f.Suppressed || f.Status != string(monitors.Running) || f.Failure != "" {
		t.Errorf("flood: %+v", f)
	}
	if res.PeakRSS <= 0 || res.Usage.ReplicaRSS <= 0 {
		t.Errorf("memory: peak %d, %+v", res.PeakRSS, res.Usage)
	}
}

// TestMonitorTracker books deliveries as the bench reads them: numbered
// lines timed from the time they carry, a number seen again counted as a
// duplicate, a line without one as other, a suppressed count summed.
func TestMonitorTracker(t *testing.T) {
	sent := time.Now().Add(-time.Second)
	event := func(seq int64, suppressed int64, lines ...string) []byte {
		m := &monitors.Monitor{ID: "m", AgentID: "a", Description: "d"}
		env := monitors.EventEnvelope(m, &monitors.Batch{Seq: seq, Lines: lines, Suppressed: suppressed}, time.Now())
		b, err := json.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tr := newTracker()
	now := time.Now()
	tr.add(event(0, 0, "warm-up"), now)
	tr.add(event(1, 0, timedLine(1, sent), "monbench.a.x "+timedLine(2, sent)), now)
	tr.add(event(2, 7, timedLine(2, sent)), now)
	tr.add([]byte(`{"id":"x","kind":"`+subjects.KindMonitorStopped+`","data":{"monitor_id":"m","reason":"flood"}}`), now)
	tr.add([]byte(`not json`), now)
	if n, other := tr.seen(); n != 2 || other != 1 {
		t.Errorf("seen %d numbered, %d other; want 2, 1", n, other)
	}
	l := tr.latency("x", "y", 3)
	if l.Received != 2 || l.Missing != 1 || l.Duplicated != 1 || l.Envelopes != 3 || l.MaxLines != 2 || l.LatencyMs.P50 < 1000 {
		t.Errorf("latency %+v", l)
	}
	if tr.said != 7 || tr.saying != 1 || tr.stopped == nil || tr.stopped.Reason != "flood" || tr.bad != 1 || tr.lines != 4 {
		t.Errorf("tracker %+v", tr)
	}
	tr.reset()
	if n, other := tr.seen(); n != 0 || other != 0 || tr.envelopes != 0 || tr.stopped != nil {
		t.Errorf("after reset: %+v", tr)
	}
	if _, _, ok := parseTimed("monbench.a.x 0 12"); ok {
		t.Error("line 0 parsed: numbers start at 1")
	}
}
