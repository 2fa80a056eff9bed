package e2e_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/internal/natsproc/natsproctest"
	"github.com/chime-nats/chime/monitors"
	"github.com/chime-nats/chime/subjects"
)

// monitorLines follows the monitor_event envelopes stored in agents'
// inboxes, from a core subscription, to tell how far each monitor got;
// the checks read the inbox stream itself.
type monitorLines struct {
	mu    sync.Mutex
	lines map[string][]string // agent -> lines, in arrival order
}

func (m *monitorLines) add(msg *nats.Msg) {
	var env subjects.Envelope
	var d monitors.EventData
	if json.Unmarshal(msg.Data, &env) != nil || env.Kind != subjects.KindMonitorEvent || json.Unmarshal(env.Data, &d) != nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lines[env.AgentID] = append(m.lines[env.AgentID], d.Lines...)
}

func (m *monitorLines) has(agent, line string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Contains(m.lines[agent], line)
}

func (m *monitorLines) count(agent string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.lines[agent])
}

// monitorEvents are the monitor_event envelopes of one agent's monitor in
// the inbox stream, and their data.
func monitorEvents(t *testing.T, nc *nats.Conn, agent, monitorID string) ([]subjects.Envelope, []monitors.EventData) {
	t.Helper()
	var envs []subjects.Envelope
	var data []monitors.EventData
	for _, env := range monitorEnvelopes(t, nc, subjects.KindMonitorEvent) {
		if env.AgentID != agent || env.Source.ID != monitorID {
			continue
		}
		var d monitors.EventData
		if err := json.Unmarshal(env.Data, &d); err != nil {
			t.Fatalf("envelope %s: %v", env.ID, err)
		}
		envs, data = append(envs, env), append(data, d)
	}
	return envs, data
}

// TestMonitorsAcrossNATSServerRestart: chime on a nats-server process,
// a command monitor run by `chime monitor run` (a shell printing numbered
// lines) and a subject monitor fed by a publisher; the nats-server is
// SIGKILLed mid-run, stays down past the executor's 10 s request timeout
// (so a batch sent while it was down is sent again under its seq, and
// arrives twice once the server is back), then restarts on its store.
// The command's every line is in the inbox exactly once, its batches'
// seqs contiguous; the subject's lines are never repeated (at most once:
// those published while the server was down may be missing), and what is
// published once the watch is back all arrives.
func TestMonitorsAcrossNATSServerRestart(t *testing.T) {
	srv := natsproctest.Standalone(t)
	url := srv.ClientURL()
	p := startServe(t, "monrestart", "CHIME_NATS_URL="+url, "CHIME_MONITOR_SUBJECTS=ci.{agent}.>")
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	seen := &monitorLines{lines: map[string][]string{}}
	if _, err := nc.Subscribe(subjects.InboxWildcard, seen.add); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	// The subject monitor, fed 5 lines a second (below its 10/s refill:
	// nothing suppressed) until the end.
	const subAgent, subject = "submon", "ci.submon.status"
	msg, err := nc.Request(subjects.Agent(subAgent, monitors.ActionStart), []byte(`{"description":"ci","subject":"`+subject+`","persistent":true}`), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var subMon monitors.Monitor
	if err := json.Unmarshal(msg.Data, &subMon); err != nil || subMon.ID == "" {
		t.Fatalf("start: %s %v", msg.Data, err)
	}
	var pubMu sync.Mutex
	published := 0
	pubStop, pubDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(pubDone)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-pubStop:
				return
			case <-tick.C:
			}
			pubMu.Lock()
			published++
			// While the server is down the client buffers it, and sends it
			// on reconnecting: before or after chime subscribes again.
			_ = nc.Publish(subject, []byte(strconv.Itoa(published)))
			pubMu.Unlock()
		}
	}()
	stopPublishing := sync.OnceValue(func() int {
		close(pubStop)
		<-pubDone
		return published
	})
	defer stopPublishing()
	subLine := func(n int) string { return fmt.Sprintf("%s %d", subject, n) }
	eventually(t, 20*time.Second, "the subject monitor's first line", func() bool { return seen.count(subAgent) > 0 })

	// The command monitor: 120 numbered lines, one every 0.2 s.
	const cmdAgent, cmdLines = "cmdmon", 120
	cmd := exec.Command(binary, "monitor", "run", "--agent", cmdAgent, "--id", "count", "--description", "count", "--persistent", "--",
		"sh", "-c", fmt.Sprintf(`i=0; while [ $i -lt %d ]; do i=$((i+1)); echo "line $i"; sleep 0.2; done`, cmdLines))
	cmd.Env = append(os.Environ(), "CHIME_NATS_URL="+url)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	var out []string
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			out = append(out, sc.Text())
		}
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("--- chime monitor run stderr ---\n%s", stderr.String())
		}
	})

	// The batches the executor sends, as the server passes them on: one
	// sent while the server was down goes again once it is back.
	var sendsMu sync.Mutex
	sends := map[int64]int{}
	if _, err := nc.Subscribe(subjects.Agent(cmdAgent, monitors.ActionEmit), func(m *nats.Msg) {
		var r monitors.EmitRequest
		if json.Unmarshal(m.Data, &r) == nil && r.Seq != nil {
			sendsMu.Lock()
			sends[*r.Seq]++
			sendsMu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the command's first 20 lines", func() bool { return seen.count(cmdAgent) >= 20 })
	srv.Kill()
	killed := time.Now()
	eventually(t, 15*time.Second, "chime says not ready", func() bool { return p.readyz() == http.StatusServiceUnavailable })
	// Past the executor's request timeout (10 s): the batch it sent while
	// the server was down is sent again.
	time.Sleep(time.Until(killed.Add(11 * time.Second)))
	srv.Restart()
	pubMu.Lock()
	atRestart := published
	pubMu.Unlock()
	t.Logf("server down %v; %d subject lines published by then", time.Since(killed).Round(time.Millisecond), atRestart)
	eventually(t, 30*time.Second, "chime ready again", func() bool { return p.readyz() == http.StatusOK })

	// The subject's watch is back once a line published after the restart
	// arrives; from then on every line arrives.
	var back int
	eventually(t, 30*time.Second, "a subject line published after the restart", func() bool {
		pubMu.Lock()
		n := published
		pubMu.Unlock()
		for i := n; i > atRestart; i-- {
			if seen.has(subAgent, subLine(i)) {
				back = i
				return true
			}
		}
		return false
	})
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("chime monitor run: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("chime monitor run still running 60 s after the restart")
	}
	last := stopPublishing()
	eventually(t, 10*time.Second, "the last subject line", func() bool { return seen.has(subAgent, subLine(last)) })
	eventually(t, 10*time.Second, "the command's last line", func() bool { return seen.has(cmdAgent, fmt.Sprintf("line %d", cmdLines)) })

	// The executor's final record: every line delivered, none suppressed,
	// the monitor ended by its command's exit.
	if len(out) != 2 || out[0] != `{"monitor_id":"count"}` {
		t.Fatalf("chime monitor run printed %q", out)
	}
	var final monitors.Monitor
	if err := json.Unmarshal([]byte(out[1]), &final); err != nil {
		t.Fatal(err)
	}
	if final.StopReason != monitors.ReasonSourceEnded || final.ExitCode == nil || *final.ExitCode != 0 || final.Events != cmdLines || final.Suppressed != 0 {
		t.Fatalf("final record: %+v", final)
	}

	// Nothing stored twice.
	ids := map[string]bool{}
	for _, env := range monitorEnvelopes(t, nc, subjects.KindMonitorEvent) {
		if ids[env.ID] {
			t.Errorf("envelope %s stored twice", env.ID)
		}
		ids[env.ID] = true
	}

	// The command: every line once, in order, in batches of contiguous seqs.
	envs, data := monitorEvents(t, nc, cmdAgent, "count")
	var got []string
	for _, d := range data {
		got = append(got, d.Lines...)
	}
	for i, d := range data {
		if d.Seq != int64(i) || envs[i].ID != monitors.EventEnvelopeID("count", int64(i)) {
			t.Errorf("command batch %d of the inbox is seq %d (%s), want seq %d: the seqs are not contiguous", i, d.Seq, envs[i].ID, i)
			break
		}
	}
	var want []string
	for i := 1; i <= cmdLines; i++ {
		want = append(want, fmt.Sprintf("line %d", i))
	}
	if !slices.Equal(got, want) {
		t.Errorf("the command's lines, %d in %d batches, are not line 1..%d once each in order: %s", len(got), len(data), cmdLines, lineDiff(got, want))
	}
	sendsMu.Lock()
	var resent []int64
	for seq, n := range sends {
		if n > 1 {
			resent = append(resent, seq)
		}
	}
	sendsMu.Unlock()
	slices.Sort(resent)
	t.Logf("command: %d lines in %d batches; batches sent more than once (across the restart): %v", len(got), len(data), resent)
	if final.Batches != int64(len(data)) || final.NextSeq != int64(len(data)) {
		t.Errorf("the record counts %d batches (next seq %d); the inbox holds %d", final.Batches, final.NextSeq, len(data))
	}
	stops := 0
	for _, env := range monitorEnvelopes(t, nc, subjects.KindMonitorStopped) {
		if env.AgentID == cmdAgent {
			stops++
		}
	}
	if stops != 1 {
		t.Errorf("%d monitor_stopped for the command monitor, want 1", stops)
	}

	// The subject: no line twice; seqs increasing; every line from the
	// watch's return on.
	_, data = monitorEvents(t, nc, subAgent, subMon.ID)
	times := map[string]int{}
	lastSeq := int64(-1)
	for _, d := range data {
		if d.Seq <= lastSeq {
			t.Errorf("subject batch seq %d after %d", d.Seq, lastSeq)
		}
		lastSeq = d.Seq
		for _, l := range d.Lines {
			times[l]++
		}
	}
	missing := 0
	for n := 1; n <= last; n++ {
		switch c := times[subLine(n)]; {
		case c > 1:
			t.Errorf("subject line %d delivered %d times", n, c)
		case c == 0 && n >= back:
			t.Errorf("subject line %d, published after the watch was back (from line %d), is missing", n, back)
		case c == 0:
			missing++
		}
	}
	t.Logf("subject: %d lines published, %d delivered, %d missing (published while no watch ran); the watch was back by line %d",
		last, len(times), missing, back)
}

// lineDiff says how got differs from want: lines repeated, missing, or
// out of order.
func lineDiff(got, want []string) string {
	count := map[string]int{}
	for _, l := range got {
		count[l]++
	}
	var twice, missing []string
	for _, l := range want {
		switch count[l] {
		case 0:
			missing = append(missing, l)
		case 1:
		default:
			twice = append(twice, l)
		}
	}
	return fmt.Sprintf("repeated %q, missing %q, first lines %q", twice, missing, got[:min(len(got), 5)])
}
