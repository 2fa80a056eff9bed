package monitors_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/chime-nats/chime/monitors"
)

var t0 = time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)

func running(match, exclude string, maxEvents int64) *monitors.Monitor {
	return &monitors.Monitor{ID: "m1", AgentID: "a1", Description: "log", Match: match, Exclude: exclude, MaxEvents: maxEvents,
		Status: monitors.Running, CreatedAt: t0}
}

func lines(n int, format string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(format, i)
	}
	return out
}

// TestApplyFiltersAndCaps: match and exclude keep what they say, a long
// line is cut at a character boundary and says so, a batch of filtered
// lines delivers nothing but moves the seq.
func TestApplyFiltersAndCaps(t *testing.T) {
	pace := monitors.Pace{Rate: 10, Burst: 100}
	m := running("ERROR|WARN", "ignore", 0)
	long := "ERROR " + strings.Repeat("é", monitors.MaxLineBytes)
	b, stop := monitors.Apply(m, 0, []string{"ERROR one", "INFO two", "WARN ignore me", long, "WARN three\r\n"}, 0, t0, pace)
	if stop != "" || len(b.Lines) != 3 || b.Lines[0] != "ERROR one" || b.Lines[2] != "WARN three" {
		t.Fatalf("batch %q stop %q", b.Lines, stop)
	}
	cut := b.Lines[1]
	if !strings.HasPrefix(cut, "ERROR ") || !strings.HasSuffix(cut, "bytes cut]") || len(cut) > monitors.MaxLineBytes+40 || strings.ContainsRune(cut, '\uFFFD') {
		t.Fatalf("cut line: %d bytes, ends %q", len(cut), cut[len(cut)-30:])
	}
	if m.Events != 3 || m.Filtered != 2 || m.Batches != 1 || m.NextSeq != 1 || m.LastEventAt == nil {
		t.Fatalf("counts: %+v", m)
	}
	b, _ = monitors.Apply(m, 1, []string{"INFO only"}, 0, t0.Add(time.Second), pace)
	if !b.Empty() || m.NextSeq != 2 || m.Batches != 1 || !m.LastEventAt.Equal(t0) {
		t.Fatalf("filtered batch: %+v %+v", b, m)
	}
}

// TestApplySuppressesAndStopsAFlood: beyond the bucket, lines are dropped
// and the next batch delivered says how many in one line; a monitor that
// loses lines batch after batch for 30 s is stopped (flood); a quiet
// batch in between resets that clock.
func TestApplySuppressesAndStopsAFlood(t *testing.T) {
	pace := monitors.Pace{Rate: 10, Burst: 20}
	m := running("", "", 0)
	b, _ := monitors.Apply(m, 0, lines(50, "line %d"), 0, t0, pace)
	if len(b.Lines) != 20 || b.Suppressed != 30 || m.Suppressed != 30 || m.PendingSuppressed != 0 || m.FloodSince == nil {
		t.Fatalf("first: %d lines, %+v", len(b.Lines), m)
	}
	// No token left: nothing delivered, the count waits for the next batch.
	b, _ = monitors.Apply(m, 1, lines(5, "more %d"), 0, t0, pace)
	if !b.Empty() || m.PendingSuppressed != 5 || m.Suppressed != 35 {
		t.Fatalf("empty bucket: %+v %+v", b, m)
	}
	// A second later: 10 tokens; the batch carries the 5 dropped.
	b, _ = monitors.Apply(m, 2, lines(10, "next %d"), 0, t0.Add(time.Second), pace)
	env := monitors.EventEnvelope(m, &b, t0)
	if len(b.Lines) != 10 || b.Suppressed != 5 || m.PendingSuppressed != 0 || !strings.HasSuffix(env.Text, "\n5 events suppressed") ||
		env.ID != "monitor_m1_2" || env.Trust != "external" || !strings.HasPrefix(env.Text, "Monitor m1 (log):\nnext 0") {
		t.Fatalf("after refill: %+v\n%s", b, env.Text)
	}
	// A quiet batch ends the flood.
	if m.FloodSince != nil {
		t.Fatalf("flood clock not reset by a batch that lost nothing: %v", m.FloodSince)
	}
	// Flooding from t0+10s on: stopped once 30 s have passed.
	seq := int64(3)
	for at := t0.Add(10 * time.Second); ; at = at.Add(200 * time.Millisecond) {
		_, stop := monitors.Apply(m, seq, lines(40, "flood %d"), 0, at, pace)
		seq++
		if stop != "" {
			if stop != monitors.ReasonFlood || at.Sub(t0.Add(10*time.Second)) != monitors.FloodFor {
				t.Fatalf("stopped %q at %v", stop, at.Sub(t0))
			}
			break
		}
		if at.After(t0.Add(time.Minute)) {
			t.Fatal("a 50 s flood was not stopped")
		}
	}
}

// TestApplyMaxEvents: the batch that reaches max_events delivers up to it
// and stops the monitor.
func TestApplyMaxEvents(t *testing.T) {
	m := running("", "", 5)
	if b, stop := monitors.Apply(m, 0, lines(3, "%d"), 0, t0, monitors.DefaultPace()); len(b.Lines) != 3 || stop != "" {
		t.Fatalf("%+v %q", b, stop)
	}
	b, stop := monitors.Apply(m, 1, lines(3, "%d"), 0, t0, monitors.DefaultPace())
	if len(b.Lines) != 2 || stop != monitors.ReasonMaxEvents || m.Events != 5 {
		t.Fatalf("%+v %q %+v", b, stop, m)
	}
}

// TestGatherBatchesWithinTheWindow: lines within 200 ms of a batch's first
// go together; a batch is sent at once at MaxBatchLines; the rest when the
// input ends.
func TestGatherBatchesWithinTheWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		in := make(chan string)
		var got [][]string
		var at []time.Duration
		start := time.Now()
		done := make(chan error, 1)
		go func() {
			done <- monitors.Gather(context.Background(), in, func(_ context.Context, l []string) error {
				got, at = append(got, slices.Clone(l)), append(at, time.Since(start))
				return nil
			})
		}()
		in <- "a"
		time.Sleep(150 * time.Millisecond)
		in <- "b"
		time.Sleep(100 * time.Millisecond) // the window closed at 200 ms
		in <- "c"
		time.Sleep(300 * time.Millisecond)
		for _, l := range lines(monitors.MaxBatchLines+1, "x%d") {
			in <- l
		}
		synctest.Wait()
		close(in)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		want := [][]string{{"a", "b"}, {"c"}, lines(monitors.MaxBatchLines, "x%d"), {fmt.Sprintf("x%d", monitors.MaxBatchLines)}}
		if len(got) != len(want) {
			t.Fatalf("batches %d, want %d: %q", len(got), len(want), got)
		}
		for i := range want {
			if !slices.Equal(got[i], want[i]) {
				t.Fatalf("batch %d: %q, want %q", i, got[i], want[i])
			}
		}
		if at[0] != 200*time.Millisecond || at[1] != 450*time.Millisecond || at[2] != 550*time.Millisecond || at[3] != 550*time.Millisecond {
			t.Fatalf("flushed at %v", at)
		}
	})
}

// TestCapLineOnce: a line cut as a source queues it is not cut again when
// its batch is applied: the count said is the bytes the first cut took.
func TestCapLineOnce(t *testing.T) {
	long := strings.Repeat("x", monitors.MaxLineBytes+63488)
	once := monitors.CapLine(long)
	if !strings.HasSuffix(once, "… [63488 bytes cut]") {
		t.Fatalf("cut: ...%q", once[len(once)-30:])
	}
	if twice := monitors.CapLine(once); twice != once {
		t.Fatalf("cut again: ...%q", twice[len(twice)-30:])
	}
	if short := "ends like a cut… [12 bytes cut]"; monitors.CapLine(short) != short {
		t.Fatal("a short line changed")
	}
}
