package browser_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/questions"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
	"github.com/chime-nats/chime/waits"
)

// rowIDs are the agent IDs of the fleet list's rows, in order.
const rowIDs = `[...document.querySelectorAll('#fleet-list tr')].map((r) => r.dataset.id)`

// cell is the text of one count of an agent's row.
func cell(agent, count string) string {
	return fmt.Sprintf(`document.querySelector('#fleet-list tr[data-id="%s"] .c-%s')?.textContent`, agent, count)
}

// docsShot writes the page as shown (the viewport, not the whole page:
// a modest PNG) to CHIME_CONSOLE_DOCS, when set: the README's
// screenshots are made by `CHIME_CONSOLE_DOCS=$PWD/../../docs go test
// -run TestConsoleFleet`.
func docsShot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("CHIME_CONSOLE_DOCS")
	if dir == "" {
		return
	}
	png := read(t, ctx, "screenshot", chromedp.CaptureScreenshot())
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s (%d bytes)", filepath.Join(dir, name), len(png))
}

// TestConsoleFleet: the landing page lists every agent with a record (one
// with only a timer too) with its state and counts; search and the state
// filter narrow it; a question with options waiting on the operator shows
// only its options and is answered in place; a timer made over NATS
// changes its agent's count without a reload; Stop asks first, and
// Cancel keeps the agent running.
func TestConsoleFleet(t *testing.T) {
	p, nc, timerOnly := consoleChime(t, "timer-only")
	base := "http://" + p.httpAddr
	bg := context.Background()
	if _, err := timerOnly.CreateTimer(bg, 600000, 0, "later"); err != nil {
		t.Fatal(err)
	}
	waiter, _ := client.New(nc, "waiter")
	var wait waits.WaitReply
	if err := waiter.Request(bg, waits.ActionWaitRequest, []byte(`{"seconds":600}`), &wait); err != nil {
		t.Fatal(err)
	}
	// The waiter's view is the README's agent screenshot: a timer, a
	// finished task and a finished timer beside its wait.
	if _, err := waiter.CreateTimer(bg, 3600000, 0, "check the nightly build"); err != nil {
		t.Fatal(err)
	}
	if done, err := waiter.CreateTimer(bg, 600000, 0, "poll the queue"); err != nil {
		t.Fatal(err)
	} else if _, err := waiter.CancelTimer(bg, done.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := waiter.StartTask(bg, "lint-3", "make lint"); err != nil {
		t.Fatal(err)
	}
	code := 0
	if _, err := waiter.ReportResult(bg, tasks.TaskResultRequest{TaskID: "lint-3", Status: tasks.TaskCompleted, Output: new("ok"), ExitCode: &code}); err != nil {
		t.Fatal(err)
	}
	asker, _ := client.New(nc, "asker")
	ask, err := asker.Ask(bg, questions.QuestionItem{Title: "Deploy to production?", Options: []string{"deploy", "hold"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := asker.StartTask(bg, "build-9", "make build"); err != nil {
		t.Fatal(err)
	}
	notify(t, nc, "noter", map[string]any{"message": "Disk 91% full", "priority": 10})
	intervene(t, base, "pauser", `{"action":"pause"}`)

	ctx := browser(t)
	run(t, ctx, 30*time.Second, "the fleet",
		chromedp.Navigate(base+"/"),
		poll(rowIDs+`.join() === 'asker,noter,pauser,timer-only,waiter'`),
		poll(`document.querySelector('#conn').textContent === 'live'`))
	got := read(t, ctx, "the rows", chromedp.Evaluate[[]string](`[...document.querySelectorAll('#fleet-list tr')].map((r) => [...r.cells].map((c) => c.textContent).join(' '))`))
	want := []string{
		"asker active 0 0 1 0 1 0",
		"noter active 0 0 0 0 0 1",
		"pauser paused 0 0 0 0 0 0",
		"timer-only active 1 0 0 0 0 0",
		"waiter waiting 1 1 0 0 0 0",
	}
	if !slices.Equal(got, want) {
		t.Errorf("rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if totals := read(t, ctx, "totals", chromedp.Text(chromedp.ID("fleet-counts"))); totals != "5 agents: 3 active, 1 waiting, 1 paused, 0 stopped" {
		t.Errorf("totals: %q", totals)
	}
	docsShot(t, ctx, "console-fleet.png")
	run(t, ctx, 10*time.Second, "the picker offers an agent with only a timer",
		poll(`document.querySelector('#agent-list option[value="timer-only"]') !== null`))
	run(t, ctx, 10*time.Second, "clear asks first",
		chromedp.WaitVisible(chromedp.CSS(`#notif-list li[data-agent="noter"]`)),
		chromedp.Click(chromedp.ID("clear-all")),
		chromedp.WaitVisible(chromedp.CSS(`#stop-dialog[open] #stop-confirm`)),
		poll(`document.querySelector('#stop-confirm').textContent === 'Clear'`),
		chromedp.Click(chromedp.ID("stop-cancel")),
		chromedp.WaitNotPresent(chromedp.CSS(`#stop-dialog[open]`)))
	if a := fleetAgent(t, base, "noter"); a.Unread != 1 {
		t.Fatalf("after a cancelled clear: %+v", a)
	}
	run(t, ctx, 10*time.Second, "clear, confirmed",
		chromedp.Click(chromedp.ID("clear-all")),
		chromedp.Click(chromedp.CSS(`#stop-dialog[open] #stop-confirm`)),
		chromedp.WaitNotPresent(chromedp.CSS(`#notif-list li[data-agent="noter"]`)),
		// Its only record gone, the agent leaves the fleet, live.
		poll(`document.querySelector('#fleet-list tr[data-id="noter"]') === null && document.querySelector('#fleet-total').textContent === '4'`))

	run(t, ctx, 10*time.Second, "search",
		chromedp.SendKeys(chromedp.ID("fleet-search"), "ER"),
		poll(rowIDs+`.join() === 'asker,pauser,timer-only,waiter'`),
		chromedp.SendKeys(chromedp.ID("fleet-search"), "-o"),
		poll(rowIDs+`.join() === 'timer-only'`))
	run(t, ctx, 10*time.Second, "the state filter",
		chromedp.Evaluate[chromedp.Void](`(() => { const s = document.querySelector('#fleet-search'); s.value = ''; s.dispatchEvent(new Event('input')); })()`),
		chromedp.Evaluate[chromedp.Void](`(() => { const s = document.querySelector('#fleet-state'); s.value = 'paused'; s.dispatchEvent(new Event('change')); })()`),
		poll(rowIDs+`.join() === 'pauser'`),
		chromedp.Evaluate[chromedp.Void](`(() => { const s = document.querySelector('#fleet-state'); s.value = ''; s.dispatchEvent(new Event('change')); })()`),
		poll(rowIDs+`.length === 4`))

	// Waiting on you: the question shows its options only, and is answered
	// here; the asker's count follows.
	form := `#queue-list form[data-agent="asker"][data-id="` + ask.QuestionID + `"]`
	run(t, ctx, 10*time.Second, "the queue", chromedp.WaitVisible(chromedp.CSS(form+` .options`)))
	if inputs := read(t, ctx, "text boxes", chromedp.Evaluate[int](`document.querySelectorAll('`+form+` input').length`)); inputs != 0 {
		t.Errorf("a question with options shows %d text boxes", inputs)
	}
	run(t, ctx, 30*time.Second, "answer in place",
		chromedp.Evaluate[chromedp.Void](`window.__sameDocument = true`),
		chromedp.Click(chromedp.CSS(form+` .options button:nth-child(1)`)),
		chromedp.Click(chromedp.CSS(form+` button[type="submit"]`)),
		chromedp.WaitNotPresent(chromedp.CSS(form)),
		poll(cell("asker", "questions")+` === '0'`),
		poll(`document.querySelector('#queue-count').textContent === '0'`))
	var answered []subjects.Envelope
	for _, env := range agentInbox(t, nc, "asker") {
		if env.Kind == subjects.KindAnswer && env.Source.ID == ask.QuestionID {
			answered = append(answered, env)
		}
	}
	if len(answered) != 1 || !strings.Contains(answered[0].Text, "deploy") {
		t.Fatalf("answers: %+v", answered)
	}

	// Live: a timer made over NATS, and a new agent, show without a reload.
	if _, err := timerOnly.CreateTimer(bg, 600000, 0, "another"); err != nil {
		t.Fatal(err)
	}
	late, _ := client.New(nc, "late")
	if _, err := late.CreateTimer(bg, 600000, 0, "new here"); err != nil {
		t.Fatal(err)
	}
	run(t, ctx, 10*time.Second, "live counts",
		poll(cell("timer-only", "timers")+` === '2'`),
		poll(cell("late", "timers")+` === '1'`),
		poll(`document.querySelector('#fleet-total').textContent === '5'`))
	if same := read(t, ctx, "no reload", chromedp.Evaluate[bool](`window.__sameDocument === true`)); !same {
		t.Error("the page was reloaded")
	}

	// Stop asks first: Cancel sends nothing, confirming stops the agent.
	run(t, ctx, 30*time.Second, "stop, cancelled",
		chromedp.Click(chromedp.CSS(`#fleet-list tr[data-id="waiter"] button.agent-link`)),
		chromedp.WaitVisible(chromedp.CSS(`#w-list li[data-id="`+wait.WaitID+`"]`)),
		chromedp.Click(chromedp.CSS(`#i-form button[data-action="stop"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#stop-dialog[open] #stop-confirm`)),
		poll(`document.querySelector('#stop-text').textContent.includes('waiter')`),
		chromedp.Click(chromedp.ID("stop-cancel")),
		chromedp.WaitNotPresent(chromedp.CSS(`#stop-dialog[open]`)))
	time.Sleep(300 * time.Millisecond)
	if a := fleetAgent(t, base, "waiter"); a.State != "waiting" {
		t.Fatalf("after a cancelled stop: %+v", a)
	}
	docsShot(t, ctx, "console-agent.png")
	run(t, ctx, 30*time.Second, "stop, confirmed",
		chromedp.Click(chromedp.CSS(`#i-form button[data-action="stop"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#stop-dialog[open] #stop-confirm`)),
		chromedp.Click(chromedp.ID("stop-confirm")),
		poll(`document.querySelector('#i-result').textContent === 'stop sent'`),
		// The wait ends: it moves to the finished list, live.
		chromedp.WaitVisible(chromedp.CSS(`#w-done li[data-id="`+wait.WaitID+`"]`)))
	if a := fleetAgent(t, base, "waiter"); a.Waits != 0 {
		t.Fatalf("after Stop: %+v", a)
	}
}

// fleetAgent reads one agent's summary from GET /api/fleet.
func fleetAgent(t *testing.T, base, agentID string) fleetSummary {
	t.Helper()
	res, err := http.Get(base + "/api/fleet?q=" + agentID)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var page struct{ Agents []fleetSummary }
	if err := json.NewDecoder(res.Body).Decode(&page); err != nil {
		t.Fatal(err)
	}
	for _, a := range page.Agents {
		if a.AgentID == agentID {
			return a
		}
	}
	t.Fatalf("%s is not in the fleet", agentID)
	return fleetSummary{}
}

type fleetSummary struct {
	AgentID string `json:"agent_id"`
	State   string `json:"state"`
	Timers  int    `json:"timers"`
	Waits   int    `json:"waits"`
	Unread  int    `json:"unread"`
}

// intervene sends an operator's intervention over HTTP.
func intervene(t *testing.T, base, agentID, body string) {
	t.Helper()
	res, err := http.Post(base+"/api/control/agents/"+agentID+"/intervention", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("intervention: %d", res.StatusCode)
	}
}

// TestConsoleAgentPaging: an agent's lists page with More instead of
// stopping at 50; active and finished timers are listed apart; IDs show
// short, with their whole in a copy button's title.
func TestConsoleAgentPaging(t *testing.T) {
	p, _, agent := consoleChime(t, "pager")
	bg := context.Background()
	var ids []string
	for i := range 60 {
		tm, err := agent.CreateTimer(bg, 600000, 0, fmt.Sprint("timer ", i))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, tm.ID)
	}
	if _, err := agent.CancelTimer(bg, ids[0]); err != nil {
		t.Fatal(err)
	}
	ctx := browser(t)
	run(t, ctx, 30*time.Second, "the first page",
		chromedp.Navigate("http://"+p.httpAddr+"/?agent=pager"),
		poll(`document.querySelectorAll('#t-list tr').length === 50`),
		chromedp.WaitVisible(chromedp.ID("t-more")))
	run(t, ctx, 30*time.Second, "more",
		chromedp.Click(chromedp.ID("t-more")),
		poll(`document.querySelectorAll('#t-list tr').length === 59 && document.querySelectorAll('#t-done tr').length === 1`),
		chromedp.WaitNotVisible(chromedp.ID("t-more")))
	done := read(t, ctx, "the finished one", chromedp.Evaluate[string](`document.querySelector('#t-done tr').dataset.id`))
	short := read(t, ctx, "a short ID", chromedp.Evaluate[[]string](`(() => { const r = document.querySelector('#t-list tr'); return [r.querySelector('.id code').textContent, r.querySelector('.id code').title, r.dataset.id]; })()`))
	if done != ids[0] || utf8.RuneCountInString(short[0]) > 11 || short[1] != short[2] || !strings.HasPrefix(short[2], strings.TrimSuffix(short[0], "…")) {
		t.Errorf("finished %q (want %q), short ID %q", done, ids[0], short)
	}
	// A live change reads the lists again with as many as are shown.
	if _, err := agent.CancelTimer(bg, ids[59]); err != nil {
		t.Fatal(err)
	}
	run(t, ctx, 10*time.Second, "a live cancel",
		poll(`document.querySelectorAll('#t-list tr').length === 58 && document.querySelectorAll('#t-done tr').length === 2`))
}

// BenchmarkConsoleFleet500 measures the fleet view with 500 agents, each
// with a timer, every fifth with an open question, in headless Chromium:
// first-render-ms is from the navigation's start to the first page of
// agents drawn (the page's chime:fleet mark), fetch-to-render-ms from
// the list's request to that; update-ms from a timer's
// create over NATS to its agent's row redrawn from the event stream. It
// also checks the paging (100 rows, then 200 with More). Run with
// `go test -run '^$' -bench ConsoleFleet500 -benchtime 5x`.
func BenchmarkConsoleFleet500(b *testing.B) {
	p, nc, _ := consoleChime(b, "bench")
	const agents = 500
	fill500(b, nc, agents)
	ctx := browser(b)
	url := "http://" + p.httpAddr + "/"
	var first, fetched, update float64
	i := 0
	for b.Loop() {
		run(b, ctx, 60*time.Second, "load",
			chromedp.Navigate(url),
			poll(fmt.Sprintf(`document.querySelectorAll('#fleet-list tr').length === 100 && document.querySelector('#fleet-total').textContent === '%d' && performance.getEntriesByName('chime:fleet').length > 0`, agents)),
			poll(`document.querySelector('#conn').textContent === 'live'`))
		first += read(b, ctx, "first render", chromedp.Evaluate[float64](`performance.getEntriesByName('chime:fleet')[0].startTime`))
		// From the list's request to its rows drawn: the page's own load
		// (HTML, script) out of it.
		fetched += read(b, ctx, "fetch to render", chromedp.Evaluate[float64](`performance.getEntriesByName('chime:fleet')[0].startTime - performance.getEntriesByType('resource').find((r) => r.name.includes('/api/fleet?')).startTime`))
		agent := fmt.Sprintf("a%03d", i%100) // on the first page
		c, _ := client.New(nc, agent)
		want := read(b, ctx, "the count", chromedp.Evaluate[string](cell(agent, "timers")))
		var n int
		fmt.Sscan(want, &n)
		start := time.Now()
		if _, err := c.CreateTimer(context.Background(), 600000, 0, "live"); err != nil {
			b.Fatal(err)
		}
		run(b, ctx, 10*time.Second, "the update", poll(fmt.Sprintf(`%s === '%d'`, cell(agent, "timers"), n+1)))
		at := read(b, ctx, "updated at", chromedp.Evaluate[float64](fmt.Sprintf(`Number(document.querySelector('#fleet-list tr[data-id="%s"]').dataset.updatedAt)`, agent)))
		update += at - float64(start.UnixNano())/1e6
		i++
	}
	run(b, ctx, 30*time.Second, "paging",
		chromedp.Click(chromedp.ID("fleet-more")),
		poll(`document.querySelectorAll('#fleet-list tr').length === 200`))
	b.ReportMetric(first/float64(b.N), "first-render-ms")
	b.ReportMetric(fetched/float64(b.N), "fetch-to-render-ms")
	b.ReportMetric(update/float64(b.N), "update-ms")
}

// fill500 gives n agents a timer each, and every fifth an open question.
func fill500(tb testing.TB, nc *nats.Conn, n int) {
	tb.Helper()
	bg := context.Background()
	for i := range n {
		c, err := client.New(nc, fmt.Sprintf("a%03d", i))
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := c.CreateTimer(bg, 600000, 0, "bench"); err != nil {
			tb.Fatal(err)
		}
		if i%5 == 0 {
			if _, err := c.Ask(bg, questions.QuestionItem{Title: "Go on?", Options: []string{"yes", "no"}}); err != nil {
				tb.Fatal(err)
			}
		}
	}
}
