package e2e_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chime-nats/chime/deliveries"
	"github.com/chime-nats/chime/internal/testlog"
	"github.com/chime-nats/chime/timers"
)

// chimeCLI runs the built binary against the NATS server at natsAddr and
// returns stdout, stderr and the exit code.
func chimeCLI(t *testing.T, natsAddr string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), "CHIME_NATS_URL=nats://"+natsAddr)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatalf("chime %v: %v", args, err)
		}
		return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("chime %v: no exit within 30s", args)
		return "", "", 0
	}
}

// cliTimer runs a timer command that must succeed and decodes its output.
func cliTimer(t *testing.T, natsAddr string, args ...string) timers.Timer {
	t.Helper()
	out, errOut, code := chimeCLI(t, natsAddr, args...)
	if code != 0 {
		t.Fatalf("chime %v: exit %d: %s", args, code, errOut)
	}
	var tm timers.Timer
	if err := json.Unmarshal([]byte(out), &tm); err != nil {
		t.Fatalf("chime %v: output %q: %v", args, out, err)
	}
	return tm
}

// TestCLITimers drives every timer command of the built binary against a
// running chime serve, including its errors, then stops serve with SIGTERM.
func TestCLITimers(t *testing.T) {
	natsAddr := freeAddr(t)
	p := startServe(t, "cli", "CHIME_DATA_DIR="+t.TempDir(), "CHIME_NATS_LISTEN="+natsAddr)

	created := cliTimer(t, natsAddr, "timer", "create", "--after-ms", "60000", "--every-ms", "30000", "--summary", "check CI", "--agent", "cli")
	if created.AgentID != "cli" || created.DurationMs != 60000 || created.IntervalMs == nil || *created.IntervalMs != 30000 ||
		!created.Repeat || created.Status != timers.TimerActive || created.Summary != "check CI" || created.FireCount != 0 {
		t.Fatalf("created: %+v", created)
	}
	if d := created.NextFireAt.Sub(created.CreatedAt); d != time.Minute {
		t.Errorf("next_fire_at - created_at = %v, want 1m", d)
	}
	legacy := cliTimer(t, natsAddr, "timer", "--after-ms", "90000", "--agent", "cli")
	if legacy.DurationMs != 90000 || legacy.Repeat {
		t.Errorf("legacy create: %+v", legacy)
	}

	out, errOut, code := chimeCLI(t, natsAddr, "timer", "list", "--json", "--limit", "1", "--agent", "cli")
	var first timers.ListTimersReply
	if code != 0 || json.Unmarshal([]byte(out), &first) != nil || len(first.Timers) != 1 || first.Timers[0].ID != created.ID || first.NextCursor == "" {
		t.Fatalf("list --limit 1: exit %d, %q %s (want the first created, %s, and a next page)", code, out, errOut, created.ID)
	}

	got := cliTimer(t, natsAddr, "timer", "get", created.ID, "--agent", "cli")
	if got.ID != created.ID || !got.NextFireAt.Equal(*created.NextFireAt) {
		t.Errorf("get: %+v", got)
	}
	for range 2 { // the second cancel is a no-op
		if c := cliTimer(t, natsAddr, "timer", "cancel", created.ID, "--agent", "cli"); c.Status != timers.TimerCancelled {
			t.Errorf("cancel: status %q", c.Status)
		}
	}

	oneShot := cliTimer(t, natsAddr, "timer", "create", "--after-ms", "1", "--agent", "cli")
	eventually(t, 10*time.Second, "one-shot completed", func() bool {
		return cliTimer(t, natsAddr, "timer", "get", oneShot.ID, "--agent", "cli").Status == timers.TimerCompleted
	})

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"timer", "cancel", oneShot.ID, "--agent", "cli"}, "timer_completed: cannot cancel completed timer " + oneShot.ID},
		{[]string{"timer", "get", "tmr_nope", "--agent", "cli"}, "timer_not_found: timer tmr_nope not found"},
		{[]string{"timer", "get", created.ID, "--agent", "someone-else"}, "timer_not_found: timer " + created.ID + " not found"},
		{[]string{"timer", "create", "--after-ms", "5", "--agent", "a.b"}, "invalid_id"},
		{[]string{"timer", "create", "--after-ms", "0"}, "--after-ms N"},
		{[]string{"timer", "create", "--after-ms", "1.5"}, "invalid value"},
		{[]string{"timer", "get"}, "one timer ID"},
		{[]string{"timer", "frobnicate"}, `unknown timer command "frobnicate"`},
		{[]string{"nope"}, `unknown command "nope"`},
	} {
		_, errOut, code := chimeCLI(t, natsAddr, tc.args...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("chime %v: exit %d, stderr %q, want non-zero and %q", tc.args, code, errOut, tc.want)
		}
	}
	if _, _, code := chimeCLI(t, natsAddr, "timer", "create", "--after-ms", "0"); code != 2 {
		t.Errorf("a usage error exits %d, want 2", code)
	}
	if n := len(cliTimerList(t, natsAddr, "cli")); n != 3 {
		t.Errorf("after the bad commands the agent has %d timers, want 3", n)
	}

	// Pages: --limit and --cursor walk them, --all reads every one.
	var page timers.ListTimersReply
	var walked []string
	for args := []string{"timer", "list", "--json", "--agent", "cli", "--limit", "2"}; ; {
		out, errOut, code := chimeCLI(t, natsAddr, args...)
		if code != 0 || json.Unmarshal([]byte(out), &page) != nil || len(page.Timers) > 2 || len(walked) > 3 {
			t.Fatalf("chime %v: exit %d, %q %s", args, code, out, errOut)
		}
		for _, tm := range page.Timers {
			walked = append(walked, tm.ID)
		}
		if page.NextCursor == "" {
			break
		}
		args = []string{"timer", "list", "--json", "--agent", "cli", "--limit", "2", "--cursor", page.NextCursor}
	}
	if len(walked) != 3 {
		t.Errorf("pages of 2 listed %v", walked)
	}
	out, errAll, code := chimeCLI(t, natsAddr, "timer", "list", "--json", "--agent", "cli", "--all")
	if code != 0 || json.Unmarshal([]byte(out), &page) != nil || len(page.Timers) != 3 || page.NextCursor != "" {
		t.Errorf("--all: exit %d, %q %s", code, out, errAll)
	}
	for _, args := range [][]string{{"--cursor", "garbage"}, {"--all", "--limit", "5"}} {
		_, errOut, code := chimeCLI(t, natsAddr, append([]string{"timer", "list", "--agent", "cli"}, args...)...)
		if code == 0 || !strings.Contains(errOut, "cursor") {
			t.Errorf("timer list %v: exit %d, %q", args, code, errOut)
		}
	}

	// serve --help lists every variable with its default.
	out, _, code = chimeCLI(t, natsAddr, "serve", "--help")
	for _, want := range []string{
		"CHIME_DATA_DIR", "./data", "CHIME_NATS_LISTEN", "127.0.0.1:4222", "CHIME_NATS_URL", "CHIME_NATS_CREDS",
		"CHIME_NATS_TOKEN", "CHIME_JS_REPLICAS", "CHIME_HTTP_ADDR", "127.0.0.1:8080", "CHIME_LEASE_TTL",
	} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("serve --help (exit %d) lacks %q:\n%s", code, want, out)
		}
	}

	// SIGTERM: drain, then exit 0.
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		p.exited <- err
		if err != nil {
			t.Errorf("serve after SIGTERM: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not exit within 20s of SIGTERM")
	}
	if !strings.Contains(p.logs.String(), "shutting down") {
		t.Errorf("no shutdown log:\n%s", p.logs.String())
	}
}

func cliTimerList(t *testing.T, natsAddr, agent string) []timers.Timer {
	t.Helper()
	out, errOut, code := chimeCLI(t, natsAddr, "timer", "list", "--json", "--agent", agent)
	var page timers.ListTimersReply
	if code != 0 || json.Unmarshal([]byte(out), &page) != nil {
		t.Fatalf("list: exit %d, %q %s", code, out, errOut)
	}
	return page.Timers
}

// TestCLIActions drives actions through the commands derived from the
// action table (no code of their own in cli): a task started, read,
// listed and cancelled, a managed wait listed and cancelled, an inbox
// read; bad input is refused with the server's error and a non-zero exit.
func TestCLIActions(t *testing.T) {
	natsAddr := freeAddr(t)
	startServe(t, "cliact", "CHIME_DATA_DIR="+t.TempDir(), "CHIME_NATS_LISTEN="+natsAddr)
	run := func(args ...string) map[string]any {
		t.Helper()
		out, errOut, code := chimeCLI(t, natsAddr, append(args, "--agent", "gen")...)
		if code != 0 {
			t.Fatalf("chime %v: exit %d: %s", args, code, errOut)
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("chime %v: output %q: %v", args, out, err)
		}
		return v
	}
	started := run("task", "start", "task_id=build-1", "title=build")
	if started["task_id"] != "build-1" || started["status"] != "running" {
		t.Fatalf("task start: %v", started)
	}
	if got := run("task", "get", "build-1"); got["title"] != "build" {
		t.Errorf("task get: %v", got)
	}
	if list := run("task", "list", "limit=10", "--json"); len(list["tasks"].([]any)) != 1 {
		t.Errorf("task list: %v", list)
	}
	// Lists are tables unless --json.
	table, errOut, code := chimeCLI(t, natsAddr, "task", "list", "--agent", "gen")
	if code != 0 || !strings.HasPrefix(table, "TASK_ID") || !strings.Contains(table, "build-1") || !strings.Contains(table, "running") {
		t.Errorf("task list as a table: exit %d, %q %s", code, table, errOut)
	}
	if got := run("task", "cancel", "build-1"); got["task_id"] != "build-1" {
		t.Errorf("task cancel: %v", got)
	}
	wait := run("wait", "request", "seconds=600")
	waitID, _ := wait["wait_id"].(string)
	if waitID == "" {
		t.Fatalf("wait request: %v", wait)
	}
	if list := run("wait", "list", "--json"); len(list["waits"].([]any)) != 1 {
		t.Errorf("wait list: %v", list)
	}
	if got := run("wait", "cancel", waitID); got["status"] != "cancelled" {
		t.Errorf("wait cancel: %v", got)
	}
	tm := run("timer", "create", "--after-ms", "600000")
	timerID, _ := tm["id"].(string)
	if got := run("timer", "pause", timerID); got["status"] != "paused" {
		t.Errorf("timer pause: %v", got)
	}
	if got := run("timer", "resume", timerID); got["status"] != "active" {
		t.Errorf("timer resume: %v", got)
	}
	if got := run("inbox", "fetch", `--body={"max":5}`); got["deliveries"] == nil {
		t.Errorf("inbox fetch: %v", got)
	}

	_, errOut, code = chimeCLI(t, natsAddr, "task", "get", "nope", "--agent", "gen")
	if code == 0 || !strings.Contains(errOut, "nope") {
		t.Errorf("task get nope: exit %d, %q", code, errOut)
	}
	_, errOut, code = chimeCLI(t, natsAddr, "task", "get", "a", "b", "--agent", "gen")
	if code == 0 || !strings.Contains(errOut, `unexpected "b"`) {
		t.Errorf("two IDs: exit %d, %q", code, errOut)
	}
	_, errOut, code = chimeCLI(t, natsAddr, "wait", "request", "bogus_field=1", "--agent", "gen")
	if code == 0 || !strings.Contains(errOut, "bogus_field") {
		t.Errorf("unknown field: exit %d, %q", code, errOut)
	}
	out, _, code := chimeCLI(t, natsAddr, "--help")
	if code != 0 || !strings.Contains(out, "chime task output TASK_ID") || !strings.Contains(out, "chime intervene") {
		t.Errorf("--help lists no derived commands: %q", out)
	}
}

// TestCLIInboxFollow: `chime inbox --follow --ack` prints each delivery
// once, as a JSON line, as it is stored; it rides out chime's restart on
// the same store, and its acks move the agent's cursor, so a plain
// `chime inbox` afterwards has nothing left to print.
func TestCLIInboxFollow(t *testing.T) {
	natsAddr, dataDir := freeAddr(t), t.TempDir()
	env := []string{"CHIME_DATA_DIR=" + dataDir, "CHIME_NATS_LISTEN=" + natsAddr}
	p := startServe(t, "follow", env...)

	cmd := exec.Command(binary, "inbox", "--follow", "--ack", "--agent", "fol")
	cmd.Env = append(os.Environ(), "CHIME_NATS_URL=nats://"+natsAddr)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testlog.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := make(chan deliveries.InboxDelivery, 10)
	go func() {
		dec := json.NewDecoder(out)
		for {
			var d deliveries.InboxDelivery
			if dec.Decode(&d) != nil {
				close(lines)
				return
			}
			lines <- d
		}
	}()
	next := func(what string) deliveries.InboxDelivery {
		t.Helper()
		select {
		case d, ok := <-lines:
			if !ok {
				t.Fatalf("%s: the follower ended: %s", what, stderr.String())
			}
			return d
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: no line within 20s: %s", what, stderr.String())
		}
		return deliveries.InboxDelivery{}
	}

	cliTimer(t, natsAddr, "timer", "create", "--after-ms", "200", "--summary", "first", "--agent", "fol")
	if d := next("first fire"); !strings.Contains(string(d.Envelope), `"text":"first"`) {
		t.Fatalf("first line: %s", d.Envelope)
	}

	// chime restarts on the same store; the follower waits it out.
	p.kill()
	startServeAt(t, "follow-2", p.httpAddr, env...)
	cliTimer(t, natsAddr, "timer", "create", "--after-ms", "200", "--summary", "second", "--agent", "fol")
	second := next("fire after the restart")
	if !strings.Contains(string(second.Envelope), `"text":"second"`) {
		t.Fatalf("second line: %s", second.Envelope)
	}
	select {
	case d := <-lines:
		t.Fatalf("a delivery printed twice or unasked: %s", d.Envelope)
	case <-time.After(500 * time.Millisecond):
	}

	// The acks moved the cursor past both.
	var rest string
	for range 50 {
		o, errOut, code := chimeCLI(t, natsAddr, "inbox", "--agent", "fol")
		if code != 0 {
			t.Fatalf("chime inbox: exit %d: %s", code, errOut)
		}
		if rest = o; rest == "" {
			break
		}
		time.Sleep(100 * time.Millisecond) // the last ack may still be on its way
	}
	if rest != "" {
		t.Fatalf("after --ack, chime inbox still prints %q", rest)
	}
}
