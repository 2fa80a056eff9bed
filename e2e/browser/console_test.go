package browser_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/console"
	"github.com/chime-nats/chime/deliveries"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/notifications"
	"github.com/chime-nats/chime/questions"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
	"github.com/chime-nats/chime/waits"
)

// The console tests drive the page served by the real `chime serve` in
// headless Chromium. They fail, not skip, without a browser: .ci/run
// installs Debian's chromium.

// browserPath finds Chromium: CHIME_CHROMIUM, else chromium or
// chromium-browser on PATH.
func browserPath(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv("CHIME_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	tb.Fatal("no chromium on PATH (apt-get install chromium, or set CHIME_CHROMIUM): the console tests need a real browser")
	return ""
}

// browser starts headless Chromium and returns a tab's context; it is
// killed when the test ends.
func browser(tb testing.TB) context.Context {
	tb.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browserPath(tb)), chromedp.WindowSize(1280, 1000),
		chromedp.Flag("disable-dev-shm-usage", true))
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses root with its sandbox
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithLogf(tb.Logf))
	tb.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		tb.Fatalf("start chromium: %v", err)
	}
	// What the page writes to its console goes to the test log: a CSP
	// refusal or an exception shows there.
	lctx, stopLog := context.WithCancel(ctx)
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		for m, err := range chromedp.Console(lctx) {
			if err != nil {
				return
			}
			tb.Logf("page console: %s (%s)", m, m.URL)
		}
	}()
	tb.Cleanup(func() {
		stopLog()
		<-logged
	})
	return ctx
}

// run runs browser steps within d.
func run(tb testing.TB, ctx context.Context, d time.Duration, what string, steps ...chromedp.Action[chromedp.Void]) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		tb.Fatalf("%s: %v", what, err)
	}
}

// read runs an action that returns a value, within 10 s.
func read[T any](tb testing.TB, ctx context.Context, what string, a chromedp.Action[T]) T {
	tb.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		tb.Fatalf("%s: %v", what, err)
	}
	return v
}

// poll waits until a JavaScript expression is true.
func poll(expr string) chromedp.Action[chromedp.Void] { return chromedp.Poll[chromedp.Void](expr) }

// artifacts is where screenshots go: CHIME_CONSOLE_ARTIFACTS, else the
// test's temporary directory.
func artifacts(t *testing.T) string {
	if d := os.Getenv("CHIME_CONSOLE_ARTIFACTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

func screenshot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	png := read(t, ctx, "screenshot", chromedp.FullScreenshot(100))
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s", path)
}

// consoleChime runs chime with its embedded NATS and returns it with an
// agent's client.
func consoleChime(t testing.TB, agentID string, env ...string) (*proc, *nats.Conn, *client.Client) {
	t.Helper()
	natsAddr := freeAddr(t)
	p := startServe(t, "console", append(env, "CHIME_DATA_DIR="+t.TempDir(), "CHIME_NATS_LISTEN="+natsAddr)...)
	nc, err := nats.Connect("nats://" + natsAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c, err := client.New(nc, agentID)
	if err != nil {
		t.Fatal(err)
	}
	return p, nc, c
}

// TestConsolePage: the page's headers, then an operator's work on it
// against a live agent: a question answered on the page reaches the
// agent's inbox; a timer created on the page fires and shows in the inbox
// list; an intervention from the page cancels a running wait; a task and
// its output show.
func TestConsolePage(t *testing.T) {
	p, nc, agent := consoleChime(t, "pan")
	base := "http://" + p.httpAddr
	res, err := http.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if h := res.Header; res.StatusCode != 200 || h.Get("Content-Security-Policy") != console.CSP ||
		!strings.Contains(console.CSP, "script-src 'self'") || !strings.Contains(console.CSP, "frame-ancestors 'none'") ||
		h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Referrer-Policy") != "no-referrer" ||
		!strings.HasPrefix(h.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: %d %v", res.StatusCode, h)
	}
	if res, err := http.Get(base + "/api/nothing"); err != nil || res.StatusCode != 404 || res.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("an unknown API route: %v %v", res, err)
	} else {
		res.Body.Close()
	}

	ctx := browser(t)
	bg := context.Background()
	var wait waits.WaitReply
	if err := agent.Request(bg, waits.ActionWaitRequest, []byte(`{"seconds":600}`), &wait); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.StartTask(bg, "build-7", "make build"); err != nil {
		t.Fatal(err)
	}
	code := 0
	if _, err := agent.ReportResult(bg, tasks.TaskResultRequest{TaskID: "build-7", Status: tasks.TaskCompleted, Output: new("compiled 42 packages"), ExitCode: &code}); err != nil {
		t.Fatal(err)
	}
	notify(t, nc, "pan", map[string]any{"message": "Deploy to staging finished", "title": "Deploy", "type": "success", "priority": 10,
		"detail": `<p>12 services, <b>0</b> errors. <a href="https://ci.example/runs/7">run 7</a></p>`})
	notify(t, nc, "pan", map[string]any{"message": "Disk 91% full on db-2", "title": "Capacity", "type": "warning", "group": "disk"})
	run(t, ctx, 30*time.Second, "open the agent",
		chromedp.Navigate(base+"/?agent=pan"),
		chromedp.WaitVisible(chromedp.CSS(`#notif-list li.t-warning`)),
		chromedp.WaitVisible(chromedp.CSS(`#w-list li[data-id="`+wait.WaitID+`"] .remaining`)),
		chromedp.WaitVisible(chromedp.CSS(`#k-done li[data-id="build-7"]`)),
		chromedp.Click(chromedp.CSS(`#k-done li[data-id="build-7"] button.output-open`)),
		chromedp.WaitVisible(chromedp.ID(`#k-output`)),
	)
	run(t, ctx, 10*time.Second, "the output", poll(`document.querySelector('#k-output').textContent === 'compiled 42 packages'`))
	remaining := read(t, ctx, "the wait", chromedp.Text(chromedp.CSS(`#w-list li[data-id="`+wait.WaitID+`"] .remaining`)))
	output := read(t, ctx, "the output", chromedp.Text(chromedp.ID("k-output")))
	if !strings.HasSuffix(remaining, "s remaining") || output != "compiled 42 packages" {
		t.Errorf("remaining %q, output %q", remaining, output)
	}

	// A question asked by the agent, answered on the page.
	ask, err := agent.Ask(bg, questions.QuestionItem{Title: "Deploy to production?", Options: []string{"deploy", "hold"}})
	if err != nil {
		t.Fatal(err)
	}
	form := `#q-list form[data-id="` + ask.QuestionID + `"]`
	run(t, ctx, 30*time.Second, "answer the question",
		chromedp.WaitVisible(chromedp.CSS(form)),
		chromedp.Click(chromedp.CSS(form+` .options button:nth-child(2)`)),
		chromedp.Click(chromedp.CSS(form+` button[type="submit"]`)),
		chromedp.WaitNotPresent(chromedp.CSS(form)),
		chromedp.WaitVisible(chromedp.CSS(`#d-list li[data-kind="answer"]`)))
	var answers []subjects.Envelope
	for _, env := range agentInbox(t, nc, "pan") {
		if env.Kind == subjects.KindAnswer && env.Source.ID == ask.QuestionID {
			answers = append(answers, env)
		}
	}
	if len(answers) != 1 || !strings.Contains(answers[0].Text, "hold") || answers[0].Trust != subjects.TrustOperator {
		t.Fatalf("answer envelopes: %+v", answers)
	}

	// A timer created on the page fires into the inbox list.
	run(t, ctx, 30*time.Second, "create a timer",
		chromedp.SetValue(chromedp.ID(`#t-after`), "0.3"),
		chromedp.SetValue(chromedp.ID(`#t-summary`), "made on the page"),
		chromedp.Click(chromedp.CSS(`#t-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#d-list li[data-kind="timer_fired"]`)))
	fired := read(t, ctx, "the fire", chromedp.Text(chromedp.CSS(`#d-list li[data-kind="timer_fired"] .text`)))
	if fired != "made on the page" {
		t.Errorf("fired: %q", fired)
	}

	// A calendar timer made on the page lists with its cron, zone and
	// next fire.
	run(t, ctx, 30*time.Second, "create a calendar timer",
		chromedp.SetValue(chromedp.ID(`#t-cron`), "30 2 * * *"),
		chromedp.SetValue(chromedp.ID(`#t-tz`), "Australia/Lord_Howe"),
		chromedp.SetValue(chromedp.ID(`#t-summary`), "nightly"),
		chromedp.Click(chromedp.CSS(`#t-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#t-list td.schedule code`)))
	sched := read(t, ctx, "the schedule", chromedp.Text(chromedp.CSS(`#t-list td.schedule`)))
	if !strings.Contains(sched, "30 2 * * *") || !strings.Contains(sched, "Australia/Lord_Howe") || !strings.Contains(sched, "DST first/shift") {
		t.Errorf("calendar timer's schedule cell: %q", sched)
	}

	// An intervention from the page cancels the running wait.
	run(t, ctx, 30*time.Second, "intervene",
		chromedp.SetValue(chromedp.ID("i-text"), "stop waiting, the build is red"),
		chromedp.Click(chromedp.CSS(`#i-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#d-list li[data-kind="wait_cancelled"]`)),
		chromedp.WaitNotPresent(chromedp.CSS(`#w-list li[data-id="`+wait.WaitID+`"] .remaining`)))
	list, err := agent.ListWaits(bg, 5)
	if err != nil || len(list.Waits) != 1 || list.Waits[0].Status != waits.WaitCancelled || list.Waits[0].CancelText != "stop waiting, the build is red" {
		t.Fatalf("waits after the intervention: %v %+v", err, list)
	}
	screenshot(t, ctx, artifacts(t), "console-agent.png")
}

// agentInbox reads the agent's last envelopes, newest first.
func agentInbox(t *testing.T, nc *nats.Conn, agentID string) []subjects.Envelope {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	page, err := deliveries.NewReader(js, engine.InboxStream).Recent(context.Background(), agentID, 100)
	if err != nil {
		t.Fatal(err)
	}
	var out []subjects.Envelope
	for _, d := range page.Deliveries {
		var env subjects.Envelope
		if err := json.Unmarshal(d.Envelope, &env); err != nil {
			t.Fatal(err)
		}
		out = append(out, env)
	}
	return out
}

// TestConsoleTokenPrompt: with operator tokens configured the page asks
// for one, says when it is refused, and works once given a good one.
func TestConsoleTokenPrompt(t *testing.T) {
	const token = "console-operator-token"
	sum := sha256.Sum256([]byte(token))
	file := filepath.Join(t.TempDir(), "operators")
	if err := os.WriteFile(file, []byte(hex.EncodeToString(sum[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, _, agent := consoleChime(t, "tok", "CHIME_OPERATOR_TOKENS_FILE="+file)
	tm, err := agent.CreateTimer(context.Background(), 600000, 0, "guarded timer")
	if err != nil {
		t.Fatal(err)
	}
	ctx := browser(t)
	run(t, ctx, 30*time.Second, "the prompt",
		chromedp.Navigate("http://"+p.httpAddr+"/?agent=tok"),
		chromedp.WaitVisible(chromedp.CSS(`#token-dialog[open] #token-input`)),
		chromedp.SendKeys(chromedp.ID(`#token-input`), "not-the-token"),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		poll(`document.querySelector('#token-error').textContent === 'That token was not accepted.'`),
		chromedp.WaitVisible(chromedp.CSS(`#token-dialog[open] #token-input`)),
		chromedp.SendKeys(chromedp.ID(`#token-input`), token),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#t-list tr[data-id="`+tm.ID+`"]`)),
		chromedp.WaitNotPresent(chromedp.CSS(`#token-dialog[open]`)))
	stored := read(t, ctx, "the stored token", chromedp.Evaluate[string](`sessionStorage.getItem('chime.operatorToken')`))
	inURL := read(t, ctx, "the URL", chromedp.Evaluate[string](`location.href`))
	if stored != token || strings.Contains(inURL, token) {
		t.Errorf("session token %q, URL %q", stored, inURL)
	}
	// The live inbox feed works with the token in a header.
	run(t, ctx, 30*time.Second, "a live delivery with the token",
		chromedp.SetValue(chromedp.ID(`#t-after`), "0.2"),
		chromedp.Click(chromedp.CSS(`#t-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#d-list li[data-kind="timer_fired"]`)))
}

// notify sends a notification as the agent does.
func notify(t testing.TB, nc *nats.Conn, agentID string, n map[string]any) {
	t.Helper()
	b, _ := json.Marshal(n)
	msg, err := nc.Request(subjects.Agent(agentID, notifications.ActionNotify), b, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(msg.Data), `"error"`) {
		t.Fatalf("notify: %s", msg.Data)
	}
}

// TestConsoleNotifications: a notification sent over NATS shows on the
// page live, as a toast and in the history; an update by id changes it in
// place; mark read updates the counts; a message with <script> shows as
// text and a detail's event handler is sanitized away.
func TestConsoleNotifications(t *testing.T) {
	p, nc, _ := consoleChime(t, "note")
	ctx := browser(t)
	run(t, ctx, 30*time.Second, "open the agent",
		chromedp.Navigate("http://"+p.httpAddr+"/?agent=note"),
		chromedp.WaitVisible(chromedp.ID(`#notifications`)),
		poll(`document.querySelector('#conn').textContent === 'live'`))

	notify(t, nc, "note", map[string]any{"id": "build", "message": "Build started", "title": "CI", "type": "progress", "priority": 10, "group": "ci"})
	item := `#notif-list li[data-id="build"]`
	run(t, ctx, 10*time.Second, "the notification live",
		chromedp.WaitVisible(chromedp.CSS(item)),
		chromedp.WaitVisible(chromedp.CSS(`#toasts .toast[data-id="build"]`)))

	notify(t, nc, "note", map[string]any{"id": "deploy", "message": "Deploy queued", "title": "CD", "priority": 10, "group": "cd"})
	run(t, ctx, 10*time.Second, "a second one", chromedp.WaitVisible(chromedp.CSS(`#notif-list li[data-id="deploy"]`)))
	notify(t, nc, "note", map[string]any{"id": "build", "message": "Build failed", "title": "CI", "type": "error", "priority": 20, "group": "ci"})
	run(t, ctx, 10*time.Second, "the update in place",
		poll(`document.querySelector('#notif-list li[data-id="build"] .n-message')?.textContent === 'Build failed'`))
	order := read(t, ctx, "items", chromedp.Evaluate[[]string](`[...document.querySelectorAll('#notif-list li')].map(li => li.dataset.id)`))
	unread := read(t, ctx, "unread", chromedp.Text(chromedp.ID("unread-count")))
	high := read(t, ctx, "high", chromedp.Text(chromedp.ID("high-count")))
	if fmt.Sprint(order) != "[deploy build]" || unread != "2" || high != "1" {
		t.Errorf("after the update: items %v (newest first, the update in its place), %s unread, %s high", order, unread, high)
	}
	if toasts := read(t, ctx, "toasts", chromedp.Evaluate[int](`document.querySelectorAll('#toasts .toast[data-id="build"]').length`)); toasts != 1 {
		t.Errorf("%d toasts for one group", toasts)
	}

	notify(t, nc, "note", map[string]any{
		"id": "xss", "title": "<b>bold?</b>", "message": `<script>window.__pwned = 1</script>`,
		"detail": `<p>see <a href="https://ci.example/1">the log</a></p><img src=x onerror="window.__pwned = 2">`, "priority": 10,
	})
	xss := `#notif-list li[data-id="xss"]`
	run(t, ctx, 10*time.Second, "the XSS attempt", chromedp.WaitVisible(chromedp.CSS(xss)))
	msgText := read(t, ctx, "message", chromedp.Text(chromedp.CSS(xss+` .n-message`)))
	detailHTML := read(t, ctx, "detail", chromedp.InnerHTML(chromedp.CSS(xss+` .n-detail`)))
	scripts := read(t, ctx, "scripts", chromedp.Evaluate[int](`document.querySelectorAll('#notif-list script').length`))
	pwned := read(t, ctx, "pwned", chromedp.Evaluate[bool](`window.__pwned !== undefined`))
	if msgText != `<script>window.__pwned = 1</script>` || scripts != 0 || pwned ||
		strings.Contains(detailHTML, "onerror") || strings.Contains(detailHTML, "<img") || !strings.Contains(detailHTML, "the log") {
		t.Errorf("message %q, detail %q, scripts %d, pwned %v", msgText, detailHTML, scripts, pwned)
	}

	run(t, ctx, 10*time.Second, "mark read",
		chromedp.Click(chromedp.CSS(item+` button.mark-read`)),
		poll(`document.querySelector('#unread-count').textContent === '2' && document.querySelector('#high-count').textContent === '0'`),
		chromedp.WaitNotPresent(chromedp.CSS(item+` button.mark-read`)))
	screenshot(t, ctx, artifacts(t), "console-notifications.png")

	// All agents: the history of each, and every agent's changes live.
	run(t, ctx, 30*time.Second, "all agents",
		chromedp.Navigate("http://"+p.httpAddr+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#notif-list li[data-agent="note"][data-id="xss"]`)),
		poll(`document.querySelector('#conn').textContent === 'live'`))
	notify(t, nc, "other", map[string]any{"id": "hello", "message": "from another agent", "priority": 10})
	run(t, ctx, 10*time.Second, "another agent's notification",
		chromedp.WaitVisible(chromedp.CSS(`#notif-list li[data-agent="other"][data-id="hello"]`)))
	if hidden := read(t, ctx, "agent panels", chromedp.Evaluate[bool](`getComputedStyle(document.querySelector('#timers')).display === 'none'`)); !hidden {
		t.Error("the agent's panels show with all agents")
	}
}

// TestConsoleDetailIDs: a detail cannot take the page's element ids. One
// naming the intervention's text box and the questions' list is shown, and
// Pause still sends and the open question still shows.
func TestConsoleDetailIDs(t *testing.T) {
	p, nc, agent := consoleChime(t, "clob")
	notify(t, nc, "clob", map[string]any{"id": "clobber", "message": "look", "priority": 10,
		"detail": `<p id="i-text" name="i-text">x</p><a id="q-list" name="q-list">q</a><form id="i-form" name="i-form"><input id="t-after" name="sign-out"></form>`})
	ask, err := agent.Ask(context.Background(), questions.QuestionItem{Title: "Ship it?", Options: []string{"yes", "no"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := browser(t)
	run(t, ctx, 30*time.Second, "open the agent",
		chromedp.Navigate("http://"+p.httpAddr+"/?agent=clob"),
		chromedp.WaitVisible(chromedp.CSS(`#notif-list li[data-id="clobber"] .n-detail p`)),
		chromedp.WaitVisible(chromedp.CSS(`#questions form.question[data-id="`+ask.QuestionID+`"]`)))
	ids := read(t, ctx, "ids in the detail", chromedp.Evaluate[int](`document.querySelectorAll('#notif-list [id], #notif-list [name]').length`))
	if ids != 0 {
		t.Errorf("%d elements with an id or a name in the notification list", ids)
	}
	run(t, ctx, 30*time.Second, "pause",
		chromedp.Click(chromedp.CSS(`#i-form button[data-action="pause"]`)),
		poll(`document.querySelector('#i-result').textContent === 'pause sent'`))
	res, err := http.Get("http://" + p.httpAddr + "/api/agents")
	if err != nil {
		t.Fatal(err)
	}
	var fleet agents.ListAgentsReply
	err = json.NewDecoder(res.Body).Decode(&fleet)
	res.Body.Close()
	if err != nil || len(fleet.Agents) != 1 || fleet.Agents[0].AgentID != "clob" || fleet.Agents[0].PausedAt == nil {
		t.Errorf("agents after the pause: %+v", fleet.Agents)
	}
	if shown := read(t, ctx, "the question", chromedp.Evaluate[bool](`!document.querySelector('#q-empty').checkVisibility() && document.getElementById('q-list').querySelector('form.question') !== null`)); !shown {
		t.Error("the open question is hidden")
	}
}

// resumer breaks the page's notification stream on demand and makes its
// reconnection resume from an older point, as a stream from a replica
// whose view lags would: the browser's own request, its Last-Event-ID
// edited on the way out (Fetch interception), to the real server.
type resumer struct {
	ctx  context.Context
	from chan string   // the Last-Event-ID of the next reconnection
	used chan struct{} // told when a reconnection took it
}

// resumes starts intercepting the page's notification streams; call it
// before the page loads.
func resumes(t *testing.T, ctx context.Context) *resumer {
	t.Helper()
	r := &resumer{ctx: ctx, from: make(chan string, 1), used: make(chan struct{}, 1)}
	events := chromedp.Events(ctx, fetch.RequestPaused)
	run(t, ctx, 10*time.Second, "intercept the streams", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{{URLPattern: "*/notifications/events*"}}})
		return err
	}))
	go func() {
		for ev, err := range events {
			if err != nil {
				return
			}
			params := fetch.ContinueRequestParams{RequestID: ev.RequestID}
			select {
			case from := <-r.from:
				for k, v := range ev.Request.Headers {
					if !strings.EqualFold(k, "Last-Event-ID") {
						params.Headers = append(params.Headers, &fetch.HeaderEntry{Name: k, Value: fmt.Sprint(v)})
					}
				}
				params.Headers = append(params.Headers, &fetch.HeaderEntry{Name: "Last-Event-ID", Value: from})
				r.used <- struct{}{}
			default:
			}
			_ = chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
				_, err := cdp.Call(ctx, tg, fetch.ContinueRequest, params)
				return err
			}))
		}
	}()
	return r
}

// resumeFrom restarts chime on the same addresses, which ends the page's
// stream, and has the page's reconnection resume from seq.
func (r *resumer) resumeFrom(t *testing.T, p *proc, env []string, seq string) {
	t.Helper()
	r.from <- seq
	p.kill()
	startServeAt(t, p.id+"-again", p.httpAddr, env...)
	// Each of the page's streams reconnects on its own backoff, and any
	// of them shows the page live: wait for the notification stream's.
	select {
	case <-r.used:
	case <-time.After(30 * time.Second):
		t.Fatal("the page's notification stream did not reconnect")
	}
	run(t, r.ctx, 30*time.Second, "the page reconnects", poll(`document.querySelector('#conn').textContent === 'live'`))
}

// TestConsoleNotificationsResume: a stream that resumes from an older
// point (a replica that lags; here a restart, the reconnection's
// Last-Event-ID edited to 0) replays a clear and every notification the
// page has, at or below the seq it applied last: the page keeps its list
// as it was, in its order, and toasts none of them again.
func TestConsoleNotificationsResume(t *testing.T) {
	natsAddr := freeAddr(t)
	env := []string{"CHIME_DATA_DIR=" + t.TempDir(), "CHIME_NATS_LISTEN=" + natsAddr}
	p := startServe(t, "console", env...)
	nc, err := nats.Connect("nats://"+natsAddr, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	notify(t, nc, "res", map[string]any{"id": "gone", "message": "before the clear", "priority": 10})
	if msg, err := nc.Request(subjects.Agent("res", notifications.ActionNotificationsClear), []byte(`{}`), 5*time.Second); err != nil || strings.Contains(string(msg.Data), `"error"`) {
		t.Fatalf("clear: %v %v", msg, err)
	}
	notify(t, nc, "res", map[string]any{"id": "b", "message": "first", "priority": 10})
	notify(t, nc, "res", map[string]any{"id": "c", "message": "second", "priority": 10})
	notify(t, nc, "res", map[string]any{"id": "b", "message": "first, updated in place", "priority": 10})
	ctx := browser(t)
	streams := resumes(t, ctx)
	run(t, ctx, 30*time.Second, "open the agent",
		chromedp.Navigate("http://"+p.httpAddr+"/?agent=res"),
		chromedp.WaitVisible(chromedp.CSS(`#notif-list li[data-id="b"]`)),
		poll(`document.querySelector('#conn').textContent === 'live'`),
		chromedp.Evaluate[chromedp.Void](`window.__toasted = []; new MutationObserver((ms) => { for (const m of ms) for (const n of m.addedNodes) window.__toasted.push(n.dataset.id); }).observe(document.querySelector('#toasts'), { childList: true })`))
	notify(t, nc, "res", map[string]any{"id": "d", "message": "live", "priority": 10})
	run(t, ctx, 10*time.Second, "a live one", chromedp.WaitVisible(chromedp.CSS(`#notif-list li[data-id="d"]`)))

	streams.resumeFrom(t, p, env, "0")
	notify(t, nc, "res", map[string]any{"id": "e", "message": "live after the resume", "priority": 10})
	run(t, ctx, 10*time.Second, "a live one after the resume", chromedp.WaitVisible(chromedp.CSS(`#notif-list li[data-id="e"]`)))
	order := read(t, ctx, "items", chromedp.Evaluate[[]string](`[...document.querySelectorAll('#notif-list li')].map(li => li.dataset.id)`))
	toasted := read(t, ctx, "toasts", chromedp.Evaluate[[]string](`window.__toasted`))
	message := read(t, ctx, "b", chromedp.Text(chromedp.CSS(`#notif-list li[data-id="b"] .n-message`)))
	if fmt.Sprint(order) != "[e d c b]" || fmt.Sprint(toasted) != "[d e]" || message != "first, updated in place" {
		t.Errorf("after the resume: items %v, toasts %v, b %q", order, toasted, message)
	}
}

// TestConsoleAllAgents: the all-agents view holds every agent's
// notifications, more than a hundred agents' (it is the all-agents
// stream's replay), toasts none of those that were there before it, and
// toasts a new one.
func TestConsoleAllAgents(t *testing.T) {
	p, nc, _ := consoleChime(t, "many")
	const agents = 130
	for i := range agents {
		notify(t, nc, fmt.Sprintf("a%03d", i), map[string]any{"id": "n", "message": fmt.Sprint("from agent ", i), "priority": 10})
	}
	ctx := browser(t)
	run(t, ctx, 30*time.Second, "all agents",
		chromedp.Navigate("http://"+p.httpAddr+"/"),
		poll(fmt.Sprintf(`document.querySelectorAll('#notif-list li').length === %d`, agents)),
		poll(`document.querySelector('#conn').textContent === 'live'`))
	if toasts := read(t, ctx, "toasts", chromedp.Evaluate[int](`document.querySelectorAll('#toasts .toast').length`)); toasts != 0 {
		t.Errorf("%d toasts for notifications there before the page", toasts)
	}
	notify(t, nc, "late", map[string]any{"id": "n", "message": "new", "priority": 10})
	run(t, ctx, 10*time.Second, "a new one",
		chromedp.WaitVisible(chromedp.CSS(`#notif-list li[data-agent="late"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#toasts .toast[data-id="n"]`)))
	if n := read(t, ctx, "items", chromedp.Evaluate[int](`document.querySelectorAll('#notif-list li').length`)); n != agents+1 {
		t.Errorf("%d items, want %d", n, agents+1)
	}
}

// BenchmarkConsoleLoad measures the page's load with 100 notifications in
// headless Chromium, each iteration a fresh navigation: fcp-ms is the first
// contentful paint and list-ms the 100 notifications rendered (the page's
// chime:notifications mark), both from the navigation's start.
func BenchmarkConsoleLoad(b *testing.B) {
	p, nc, _ := consoleChime(b, "bench")
	for i := range 100 {
		notify(b, nc, "bench", map[string]any{
			"id": fmt.Sprint("n", i), "title": fmt.Sprint("Step ", i), "message": "Deployment step finished",
			"detail": "<p>log: <code>ok</code></p>", "type": "success", "priority": 10 + 10*(i%2),
		})
	}
	ctx := browser(b)
	url := "http://" + p.httpAddr + "/?agent=bench"
	var fcp, list float64
	for b.Loop() {
		run(b, ctx, 30*time.Second, "load",
			chromedp.Navigate(url),
			poll(`document.querySelectorAll('#notif-list li').length === 100 && performance.getEntriesByName('first-contentful-paint').length > 0`))
		m := read(b, ctx, "timings", chromedp.Evaluate[[]float64](`[performance.getEntriesByName('first-contentful-paint')[0].startTime, performance.getEntriesByName('chime:notifications')[0].startTime]`))
		fcp += m[0]
		list += m[1]
	}
	b.ReportMetric(fcp/float64(b.N), "fcp-ms")
	b.ReportMetric(list/float64(b.N), "list-ms")
}
