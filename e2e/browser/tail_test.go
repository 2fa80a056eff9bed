package browser_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/monitors"
)

// emitLines sends one batch of a command monitor's lines over NATS, as
// `chime monitor run` does.
func emitLines(t *testing.T, agent *client.Client, id string, seq int, lines ...string) monitors.EmitReply {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"monitor_id": id, "seq": seq, "lines": lines})
	var r monitors.EmitReply
	if err := agent.Request(context.Background(), monitors.ActionEmit, body, &r); err != nil {
		t.Fatalf("emit %d: %v", seq, err)
	}
	return r
}

// TestConsoleMonitorTail: selecting a monitor opens its live tail, filled
// from its past events (found among more of other monitors' than it
// shows), then appended live without a reload; a line of HTML
// shows as text; the bucket's "N events suppressed" line stands apart;
// the counts follow the record; Stop asks first, a cancel keeps the
// monitor running, a confirm stops it and the tail shows it stopped; the
// page's address opens on the tail again.
func TestConsoleMonitorTail(t *testing.T) {
	p, _, agent := consoleChime(t, "tail")
	base := "http://" + p.httpAddr
	bg := context.Background()
	var m monitors.Monitor
	if err := agent.Request(bg, monitors.ActionStart, []byte(`{"description":"build log","command":"make -k","exclude":"^debug"}`), &m); err != nil {
		t.Fatal(err)
	}
	emitLines(t, agent, m.ID, 0, "compiling a", "debug: noise", "compiling b")
	// Then 210 deliveries of three other monitors (each within its
	// bucket): more than the tail's 200, so its past is found only by the
	// read limited to its source.
	for k := range 3 {
		var other monitors.Monitor
		if err := agent.Request(bg, monitors.ActionStart, []byte(`{"description":"chatter","command":"yes","monitor_id":"chatter-`+strconv.Itoa(k)+`"}`), &other); err != nil {
			t.Fatal(err)
		}
		for i := range 70 {
			if r := emitLines(t, agent, other.ID, i, "chatter "+strconv.Itoa(i)); r.Delivered != 1 {
				t.Fatalf("chatter: %+v", r)
			}
		}
	}

	ctx := browser(t)
	row := `#m-list li[data-id="` + m.ID + `"]`
	lines := `[...document.querySelectorAll('#tail-lines li.line')].map((li) => li.textContent)`
	run(t, ctx, 30*time.Second, "open the tail",
		chromedp.Navigate(base+"/?agent=tail"),
		chromedp.WaitVisible(chromedp.CSS(row+` button.tail-open`)),
		poll(`document.querySelector('#conn').textContent === 'live'`),
		chromedp.Click(chromedp.CSS(row+` button.tail-open`)),
		chromedp.WaitVisible(chromedp.ID(`#tail`)),
		poll(`document.querySelectorAll('#tail-lines li.line').length === 2`),
		poll(`document.querySelector('#tail-state').textContent === 'running'`),
		chromedp.Evaluate[chromedp.Void](`window.__sameDocument = true`))
	if got := read(t, ctx, "the history", chromedp.Evaluate[[]string](lines)); fmt.Sprint(got) != "[compiling a compiling b]" {
		t.Fatalf("tail from the history: %q", got)
	}
	if sel := read(t, ctx, "the selection", chromedp.Evaluate[bool](`document.querySelector('`+row+`').classList.contains('selected') && new URL(location.href).searchParams.get('monitor') === '`+m.ID+`'`)); !sel {
		t.Error("the tailed monitor is not marked selected, or not in the URL")
	}

	// Live: a line of HTML, as text.
	const html = `<img src=x onerror="window.__pwned=1"><b id="bold">FAIL</b> & done`
	emitLines(t, agent, m.ID, 1, html, "linking")
	emitLines(t, agent, "chatter-0", 70, "not this monitor's")
	run(t, ctx, 30*time.Second, "live lines",
		poll(`document.querySelectorAll('#tail-lines li.line').length === 4`))
	got := read(t, ctx, "the lines", chromedp.Evaluate[[]string](lines))
	if fmt.Sprint(got) != fmt.Sprint([]string{"compiling a", "compiling b", html, "linking"}) {
		t.Errorf("tail after live lines: %q", got)
	}
	if elements := read(t, ctx, "elements in the tail", chromedp.Evaluate[int](`document.querySelectorAll('#tail-lines img, #tail-lines b, #tail-lines [id]').length`)); elements != 0 {
		t.Errorf("%d elements from a line's HTML in the tail", elements)
	}
	if same := read(t, ctx, "no reload", chromedp.Evaluate[bool](`window.__sameDocument === true && window.__pwned === undefined`)); !same {
		t.Error("the page was reloaded, or a line's HTML ran")
	}

	// The bucket: 100 lines take it all, the next 100 are dropped but for a
	// token or two, and the batch after says how many.
	hundred := func(prefix string) []string {
		var out []string
		for i := range 100 {
			out = append(out, prefix+strconv.Itoa(i))
		}
		return out
	}
	emitLines(t, agent, m.ID, 2, hundred("full ")...)
	if r := emitLines(t, agent, m.ID, 3, hundred("over ")...); r.Suppressed < 90 {
		t.Fatalf("the bucket let through %d of 100 after 100: %+v", r.Delivered, r)
	}
	time.Sleep(300 * time.Millisecond) // a token or more back
	emitLines(t, agent, m.ID, 4, "after the flood")
	run(t, ctx, 30*time.Second, "the suppressed line",
		chromedp.WaitVisible(chromedp.CSS(`#tail-lines li.suppressed`)),
		poll(`[...document.querySelectorAll('#tail-lines li.line')].at(-1)?.textContent === 'after the flood'`))
	supp := read(t, ctx, "the suppressed line", chromedp.Text(chromedp.CSS(`#tail-lines li.suppressed`)))
	n, _, _ := strings.Cut(supp, " ")
	if k, err := strconv.Atoi(n); err != nil || k < 1 || !strings.HasSuffix(supp, " suppressed") {
		t.Errorf("suppressed line %q", supp)
	}
	distinct := read(t, ctx, "its look", chromedp.Evaluate[bool](`(() => {
		const s = getComputedStyle(document.querySelector('#tail-lines li.suppressed')), l = getComputedStyle(document.querySelector('#tail-lines li.line'));
		return s.color !== l.color && s.fontStyle === 'italic' && l.fontStyle === 'normal';
	})()`))
	if !distinct {
		t.Error("the suppressed line looks like any other line")
	}
	if atEnd := read(t, ctx, "the scroll", chromedp.Evaluate[bool](`(() => { const b = document.querySelector('#tail-lines'); return b.scrollHeight > b.clientHeight && b.scrollHeight - b.scrollTop - b.clientHeight < 24; })()`)); !atEnd {
		t.Error("the tail does not keep its newest line in view")
	}

	// The counts follow the record.
	var rec monitors.Monitor
	if err := agent.Request(bg, monitors.ActionGet, []byte(`{"monitor_id":"`+m.ID+`"}`), &rec); err != nil || rec.Suppressed == 0 || rec.Filtered != 1 {
		t.Fatalf("record: %+v %v", rec, err)
	}
	run(t, ctx, 30*time.Second, "the counts", poll(fmt.Sprintf(`['events', 'batches', 'filtered', 'suppressed'].map((k) => document.querySelector('#tail-' + k).textContent).join() === '%d,%d,%d,%d'`,
		rec.Events, rec.Batches, rec.Filtered, rec.Suppressed)))

	// Stop asks first; Cancel keeps it running.
	run(t, ctx, 30*time.Second, "stop, then cancel",
		chromedp.Click(chromedp.ID(`#tail-stop`)),
		chromedp.WaitVisible(chromedp.CSS(`#stop-dialog[open] #stop-confirm`)),
		poll(`document.querySelector('#stop-text').textContent.includes('`+m.ID+`')`),
		chromedp.Click(chromedp.ID(`#stop-cancel`)),
		chromedp.WaitNotPresent(chromedp.CSS(`#stop-dialog[open]`)))
	time.Sleep(500 * time.Millisecond)
	if err := agent.Request(bg, monitors.ActionGet, []byte(`{"monitor_id":"`+m.ID+`"}`), &rec); err != nil || rec.Status != monitors.Running {
		t.Fatalf("after a cancelled stop: %+v %v", rec, err)
	}
	run(t, ctx, 30*time.Second, "stop, confirmed",
		chromedp.Click(chromedp.ID(`#tail-stop`)),
		chromedp.WaitVisible(chromedp.CSS(`#stop-dialog[open] #stop-confirm`)),
		chromedp.Click(chromedp.ID(`#stop-confirm`)),
		poll(`document.querySelector('#tail-state').textContent === 'stopped'`),
		poll(`document.querySelector('#tail-reason').textContent === 'stopped: stopped'`),
		chromedp.WaitVisible(chromedp.CSS(`#tail-lines li.ended`)),
		chromedp.WaitNotVisible(chromedp.ID(`#tail-stop`)))
	if err := agent.Request(bg, monitors.ActionGet, []byte(`{"monitor_id":"`+m.ID+`"}`), &rec); err != nil || rec.StopReason != monitors.ReasonStopped {
		t.Fatalf("after Stop: %+v %v", rec, err)
	}
	if same := read(t, ctx, "no reload", chromedp.Evaluate[bool](`window.__sameDocument === true`)); !same {
		t.Error("the page was reloaded")
	}
	screenshot(t, ctx, artifacts(t), "console-monitor-tail.png")

	// The page's address opens on the tail: all of it from the history.
	before := read(t, ctx, "the lines", chromedp.Evaluate[[]string](`[...document.querySelectorAll('#tail-lines li')].map((li) => li.className + ' ' + li.textContent)`))
	run(t, ctx, 30*time.Second, "reopen by address",
		chromedp.Navigate(base+"/?agent=tail&monitor="+m.ID),
		chromedp.WaitVisible(chromedp.CSS(`#tail-lines li.ended`)),
		poll(`document.querySelector('#tail-state').textContent === 'stopped'`),
		poll(`[...document.querySelectorAll('#tail-lines li.line')].at(-1)?.textContent === 'after the flood'`))
	after := read(t, ctx, "the lines", chromedp.Evaluate[[]string](`[...document.querySelectorAll('#tail-lines li')].map((li) => li.className + ' ' + li.textContent)`))
	if len(before) < 100 || fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("reopened, the tail's %d lines are not the %d it had", len(after), len(before))
	}
}
