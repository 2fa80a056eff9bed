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
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/internal/natsproc/natsproctest"
	"github.com/chime-nats/chime/internal/testlog"
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

// highest is the highest number of the lines "<prefix> <n>" seen of agent.
func (m *monitorLines) highest(agent, prefix string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	top := 0
	for _, l := range m.lines[agent] {
		if v, ok := strings.CutPrefix(l, prefix+" "); ok {
			if n, err := strconv.Atoi(v); err == nil {
				top = max(top, n)
			}
		}
	}
	return top
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

// TestMonitorsAcrossRestarts: one chime replica on a nats-server
// process, a command monitor run by `chime monitor run` (a shell printing
// numbered lines) and a subject monitor fed by a publisher. Mid-run the
// nats-server is SIGKILLed and stays down past the executor's 10 s
// request timeout (so a batch sent while it was down is sent again under
// its seq, and both copies reach chime once the server is back), then
// restarts on its store; later the replica is SIGKILLed and a new one
// started. The command's every line is in the inbox exactly once, its
// batches' seqs contiguous; the subject's lines are never repeated (at
// most once: those published while no watch ran may be missing), and
// what is published once the watch is back all arrives.
func TestMonitorsAcrossRestarts(t *testing.T) {
	srv := natsproctest.Standalone(t)
	url := srv.ClientURL()
	env := []string{"CHIME_NATS_URL=" + url, "CHIME_MONITOR_SUBJECTS=ci.{agent}.>"}
	p := startServe(t, "monrestart", env...)
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
	publishedNow := func() int {
		pubMu.Lock()
		defer pubMu.Unlock()
		return published
	}
	// backAfter waits for the watch to be back after a fault: the first
	// line published after at that arrives; every later one must.
	backAfter := func(at int, what string) int {
		t.Helper()
		back := 0
		eventually(t, 30*time.Second, "a subject line published after "+what, func() bool {
			for i := at + 1; i <= publishedNow(); i++ {
				if seen.has(subAgent, subLine(i)) {
					back = i
					return true
				}
			}
			return false
		})
		return back
	}
	// Lines published while no watch ran may be missing: before the
	// first, and from the last seen before each fault to the watch's
	// return.
	type gap struct{ from, to int } // exclusive
	var gaps []gap
	eventually(t, 20*time.Second, "the subject monitor's first line", func() bool { return seen.count(subAgent) > 0 })
	gaps = append(gaps, gap{0, seen.highest(subAgent, subject)})

	// The command monitor: 160 numbered lines, one every 0.2 s, printing
	// through both faults.
	const cmdAgent, cmdLines = "cmdmon", 160
	cmd := exec.Command(binary, "monitor", "run", "--agent", cmdAgent, "--id", "count", "--description", "count", "--persistent", "--",
		"sh", "-c", fmt.Sprintf(`i=0; while [ $i -lt %d ]; do i=$((i+1)); echo "line $i"; sleep 0.2; done`, cmdLines))
	cmd.Env = append(os.Environ(), "CHIME_NATS_URL="+url)
	stderr := &testlog.Buffer{}
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

	// The replies to the executor's batches, by the next seq they answer
	// (a subscriber to the batches themselves would change how the
	// executor sees a missing replica: a timeout, not no responders). A
	// batch sent while the server was down is sent again, and both copies
	// are answered once it is back.
	var repliesMu sync.Mutex
	replies := map[int64]int{}
	if _, err := nc.Subscribe(access.AgentInboxPrefix(cmdAgent)+".>", func(m *nats.Msg) {
		var r map[string]json.RawMessage
		var next int64
		if json.Unmarshal(m.Data, &r) != nil || r["delivered"] == nil || json.Unmarshal(r["next_seq"], &next) != nil {
			return // not a monitor.emit reply
		}
		repliesMu.Lock()
		replies[next]++
		repliesMu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the command's first 20 lines", func() bool { return seen.count(cmdAgent) >= 20 })

	// The nats-server: SIGKILL, down 11 s, restarted on its store.
	lastSeen := seen.highest(subAgent, subject)
	srv.Kill()
	killed := time.Now()
	eventually(t, 15*time.Second, "chime says not ready", func() bool { return p.readyz() == http.StatusServiceUnavailable })
	// Past the executor's request timeout (10 s): the batch it sent while
	// the server was down is sent again.
	time.Sleep(time.Until(killed.Add(11 * time.Second)))
	srv.Restart()
	atRestart := publishedNow()
	t.Logf("nats-server down %v; %d subject lines published by then", time.Since(killed).Round(time.Millisecond), atRestart)
	eventually(t, 30*time.Second, "chime ready again", func() bool { return p.readyz() == http.StatusOK })
	back := backAfter(atRestart, "the nats-server's restart")
	gaps = append(gaps, gap{lastSeen, back})
	eventually(t, 20*time.Second, "the command's lines after the restart", func() bool { return seen.count(cmdAgent) >= 90 })

	// The replica: SIGKILL, and a new one.
	lastSeen = seen.highest(subAgent, subject)
	p.kill()
	killed = time.Now()
	p = startServe(t, "monrestart-2", env...)
	atRestart = publishedNow()
	t.Logf("replica replaced in %v; %d subject lines published by then", time.Since(killed).Round(time.Millisecond), atRestart)
	back = backAfter(atRestart, "the replica's replacement")
	gaps = append(gaps, gap{lastSeen, back})

	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("chime monitor run: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("chime monitor run still running 60 s after the replica's replacement")
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
	repliesMu.Lock()
	var twice []int64
	for next, n := range replies {
		if n > 1 {
			twice = append(twice, next-1)
		}
	}
	repliesMu.Unlock()
	slices.Sort(twice)
	t.Logf("command: %d lines in %d batches; batches answered more than once (sent again across the faults): %v", len(got), len(data), twice)
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
	mayMiss := func(n int) bool {
		for _, g := range gaps {
			if n > g.from && n < g.to {
				return true
			}
		}
		return false
	}
	missing := 0
	for n := 1; n <= last; n++ {
		switch c := times[subLine(n)]; {
		case c > 1:
			t.Errorf("subject line %d delivered %d times", n, c)
		case c == 0 && !mayMiss(n):
			t.Errorf("subject line %d, published while the watch ran (it may miss only those within %v), is missing", n, gaps)
		case c == 0:
			missing++
		}
	}
	t.Logf("subject: %d lines published, %d delivered in %d batches, %d missing; lines that could be missed (no watch running): %v", last, len(times), len(data), missing, gaps)
	msg, err = nc.Request(subjects.Agent(subAgent, monitors.ActionGet), []byte(`{"monitor_id":"`+subMon.ID+`"}`), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var rec monitors.Monitor
	if err := json.Unmarshal(msg.Data, &rec); err != nil {
		t.Fatal(err)
	}
	t.Logf("subject record: %d events in %d batches, next seq %d, %d suppressed", rec.Events, rec.Batches, rec.NextSeq, rec.Suppressed)
	// A batch stored whose count never reached the record is counted
	// when its seq is used again (monitors' adopt): the record agrees
	// with what the agent has.
	if rec.Events != int64(len(times)) || rec.Batches != int64(len(data)) {
		t.Errorf("the subject record counts %d events in %d batches; the inbox holds %d lines in %d batches", rec.Events, rec.Batches, len(times), len(data))
	}
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
