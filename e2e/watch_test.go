package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testlog"
)

// watcher is one `chime inbox watch` child and the lines it printed.
type watcher struct {
	cmd    *exec.Cmd
	stderr *testlog.Buffer
	done   chan struct{} // its stdout is read to the end
}

// watchLines collects every line of every watcher of a test, in the
// order they were read.
type watchLines struct {
	mu    sync.Mutex
	lines []watchLine
	seen  map[string]int // by envelope ID
}

type watchLine struct {
	watcher int
	seq     uint64
	id      string
	text    string
}

func (w *watchLines) add(watcher int, line string) error {
	// SEQ KIND ID TRUST: "TEXT"
	f := strings.SplitN(line, " ", 5)
	if len(f) != 5 || f[1] != "timer_fired" || f[3] != "system:" {
		return fmt.Errorf("watcher %d printed %q", watcher, line)
	}
	seq, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil {
		return fmt.Errorf("watcher %d printed %q", watcher, line)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lines = append(w.lines, watchLine{watcher: watcher, seq: seq, id: f[2], text: f[4]})
	w.seen[f[2]]++
	return nil
}

func (w *watchLines) distinct() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.seen)
}

// startWatcher runs `chime inbox watch` for agent against natsURL, with
// env added to its environment; its lines go to into, as watcher n. It is
// SIGKILLed at the test's end if still running.
func startWatcher(t *testing.T, n int, natsURL, agent string, into *watchLines, env ...string) *watcher {
	t.Helper()
	cmd := exec.Command(binary, "inbox", "watch", "--agent", agent)
	cmd.Env = append(append(os.Environ(), "CHIME_NATS_URL="+natsURL), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	w := &watcher{cmd: cmd, stderr: &testlog.Buffer{}, done: make(chan struct{})}
	cmd.Stderr = w.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if err := into.add(n, sc.Text()); err != nil {
				t.Error(err)
			}
		}
	}()
	t.Cleanup(func() {
		w.kill()
		if t.Failed() {
			t.Logf("--- watcher %d stderr ---\n%s", n, w.stderr.String())
		}
	})
	return w
}

// kill SIGKILLs the watcher and waits until every line it wrote is read.
func (w *watcher) kill() {
	_ = w.cmd.Process.Kill()
	<-w.done
	_ = w.cmd.Wait()
}

// TestInboxWatchSurvivesKills: `chime inbox watch` prints every delivery
// of a stream of timer fires although its first watcher is SIGKILLed
// mid-stream and a second started, and one of the two chime replicas is
// SIGKILLed mid-stream too: every envelope is printed, in order within
// each watcher, and at most one twice (the line a killed watcher may have
// written and not yet acked). At the end the agent's cursor is at the
// last delivery.
func TestInboxWatchSurvivesKills(t *testing.T) {
	ns := natstest.Server(t)
	url := ns.ClientURL()
	procs := []*proc{startServe(t, "w0", "CHIME_NATS_URL="+url), startServe(t, "w1", "CHIME_NATS_URL="+url)}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const agent, fires = "watcher", 150
	c, _ := client.New(nc, agent)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// Fires spread over 4.5 s, from 2 s on: the kills land mid-stream.
	start := time.Now()
	want := map[string]bool{}
	for i := range fires {
		at := start.Add(2*time.Second + time.Duration(i)*30*time.Millisecond)
		tm, err := c.CreateTimer(ctx, max(time.Until(at).Milliseconds(), 1), 0, fmt.Sprintf("fire %d\nof %d", i, fires))
		if err != nil {
			t.Fatal(err)
		}
		want["timer_"+tm.ID+"_1"] = true
	}

	lines := &watchLines{seen: map[string]int{}}
	first := startWatcher(t, 1, url, agent, lines)
	waitFor := func(n int, what string) {
		t.Helper()
		eventually(t, 40*time.Second, what, func() bool { return lines.distinct() >= n })
	}
	waitFor(fires/3, "a third printed")
	first.kill()
	t.Logf("SIGKILLed the first watcher with %d printed", lines.distinct())
	startWatcher(t, 2, url, agent, lines)
	waitFor(2*fires/3, "two thirds printed")
	procs[0].kill()
	t.Logf("SIGKILLed replica w0 with %d printed", lines.distinct())
	waitFor(fires, "every fire printed")
	time.Sleep(time.Second) // let a repeat show

	lines.mu.Lock()
	defer lines.mu.Unlock()
	repeats, last := 0, map[int]uint64{}
	var lastSeq uint64
	for _, l := range lines.lines {
		if !want[l.id] {
			t.Errorf("a line for no fire of this test: %+v", l)
		}
		if l.seq <= last[l.watcher] {
			t.Errorf("watcher %d printed %d after %d", l.watcher, l.seq, last[l.watcher])
		}
		last[l.watcher], lastSeq = l.seq, max(lastSeq, l.seq)
		if !strings.HasPrefix(l.text, `"fire `) || !strings.HasSuffix(l.text, `\nof 150"`) {
			t.Errorf("the text of a line: %s", l.text)
		}
	}
	for id := range want {
		switch n := lines.seen[id]; {
		case n == 0:
			t.Errorf("%s never printed", id)
		case n > 1:
			repeats += n - 1
		}
	}
	t.Logf("%d lines for %d fires: %d repeats (at most 1: the first watcher's kill)", len(lines.lines), fires, repeats)
	if repeats > 1 {
		t.Errorf("%d repeats, want at most 1", repeats)
	}
	got, err := c.FetchInbox(ctx, 1, 0)
	if err != nil || got.Acked != lastSeq || len(got.Deliveries) != 0 {
		t.Fatalf("the cursor after the watch: %+v %v, want acked %d and nothing left", got, err, lastSeq)
	}
}

// TestInboxWatchRidesOutARestart: a watcher connected to chime's embedded
// NATS server rides out chime's SIGKILL and restart on the same store (its
// NATS connection goes too): the fires before and after are printed, once
// each.
func TestInboxWatchRidesOutARestart(t *testing.T) {
	natsAddr, dataDir := freeAddr(t), t.TempDir()
	env := []string{"CHIME_DATA_DIR=" + dataDir, "CHIME_NATS_LISTEN=" + natsAddr}
	p := startServe(t, "watch-restart", env...)
	lines := &watchLines{seen: map[string]int{}}
	startWatcher(t, 1, "nats://"+natsAddr, "rider", lines)

	cliTimer(t, natsAddr, "timer", "create", "--after-ms", "100", "--summary", "before", "--agent", "rider")
	eventually(t, 20*time.Second, "the fire before the restart", func() bool { return lines.distinct() == 1 })
	p.kill()
	startServeAt(t, "watch-restart-2", p.httpAddr, env...)
	cliTimer(t, natsAddr, "timer", "create", "--after-ms", "100", "--summary", "after", "--agent", "rider")
	eventually(t, 30*time.Second, "the fire after the restart", func() bool { return lines.distinct() == 2 })
	time.Sleep(500 * time.Millisecond) // let a repeat show
	lines.mu.Lock()
	defer lines.mu.Unlock()
	if len(lines.lines) != 2 || lines.lines[0].text != `"before"` || lines.lines[1].text != `"after"` {
		t.Fatalf("lines %+v", lines.lines)
	}
}

// TestInboxWatchWithTokens: with NATS authorization on, a watcher given
// the agent's token in CHIME_NATS_TOKEN prints its deliveries and rides
// out chime's SIGKILL and restart (its auth callout is away meanwhile:
// authorization errors, waited out once the token has worked); one for
// another agent is refused at once (exit 1, naming the violation), and
// so is a token that names no one, rather than waiting for ever.
func TestInboxWatchWithTokens(t *testing.T) {
	addr, op, env := authedEnv(t)
	p := startServe(t, "watch-auth", env...)
	out, errOut, code := chimeCLI(t, addr, "agent", "token", "--agent", "carol", "--token", op)
	var tok struct{ Token string }
	if code != 0 || json.Unmarshal([]byte(out), &tok) != nil || tok.Token == "" {
		t.Fatalf("agent token: exit %d: %s", code, errOut)
	}
	lines := &watchLines{seen: map[string]int{}}
	startWatcher(t, 1, "nats://"+addr, "carol", lines, "CHIME_NATS_TOKEN="+tok.Token)
	cliTimer(t, addr, "timer", "create", "--after-ms", "100", "--summary", "for carol", "--agent", "carol", "--token", tok.Token)
	eventually(t, 20*time.Second, "carol's fire", func() bool { return lines.distinct() == 1 })
	p.kill()
	time.Sleep(3 * time.Second) // the watcher's reconnects meet no server, then chime without its callout
	startServeAt(t, "watch-auth-2", p.httpAddr, env...)
	cliTimer(t, addr, "timer", "create", "--after-ms", "100", "--summary", "after the restart", "--agent", "carol", "--token", tok.Token)
	eventually(t, 30*time.Second, "carol's fire after the restart", func() bool { return lines.distinct() == 2 })

	for _, tc := range []struct{ name, token, want string }{
		{"another agent's watch", tok.Token, "refused: nats: permissions violation"},
		{"a token of no one", "chime_at_nope", "refused: nats: authorization violation"},
	} {
		start := time.Now()
		_, errOut, code := chimeCLI(t, addr, "inbox", "watch", "--agent", "dave", "--token", tc.token)
		if code != 1 || !strings.Contains(strings.ToLower(errOut), tc.want) {
			t.Errorf("%s: exit %d: %s", tc.name, code, errOut)
		}
		t.Logf("%s: refused after %v", tc.name, time.Since(start).Round(time.Millisecond))
	}
}
