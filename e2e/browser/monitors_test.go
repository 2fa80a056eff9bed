package browser_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/chime-nats/chime/monitors"
	"github.com/chime-nats/chime/subjects"
)

// TestConsoleMonitors: a monitor and its counts show on the page; Stop on
// the page, confirmed, stops it, and its monitor_stopped reaches the inbox
// list.
func TestConsoleMonitors(t *testing.T) {
	p, nc, agent := consoleChime(t, "mon")
	base := "http://" + p.httpAddr
	bg := context.Background()
	var m monitors.Monitor
	if err := agent.Request(bg, monitors.ActionStart, []byte(`{"description":"CI log","command":"tail -f ci.log","match":"FAIL"}`), &m); err != nil {
		t.Fatal(err)
	}
	var r monitors.EmitReply
	if err := agent.Request(bg, monitors.ActionEmit, []byte(`{"monitor_id":"`+m.ID+`","seq":0,"lines":["FAIL one","ok two"]}`), &r); err != nil {
		t.Fatal(err)
	}
	ctx := browser(t)
	row := `#m-list li[data-id="` + m.ID + `"]`
	run(t, ctx, 30*time.Second, "open the agent",
		chromedp.Navigate(base+"/?agent=mon"),
		chromedp.WaitVisible(chromedp.CSS(row)),
		chromedp.WaitVisible(chromedp.CSS(`#d-list li[data-kind="monitor_event"]`)))
	counts := read(t, ctx, "the counts", chromedp.Text(chromedp.CSS(row+` .counts`)))
	desc := read(t, ctx, "the description", chromedp.Text(chromedp.CSS(row+` .desc`)))
	if counts != "1 events, 1 batches, 1 filtered" || desc != "CI log" {
		t.Errorf("counts %q, description %q", counts, desc)
	}
	run(t, ctx, 30*time.Second, "stop it",
		chromedp.Click(chromedp.CSS(row+` button.stop`)),
		chromedp.Click(chromedp.CSS(`#stop-dialog[open] #stop-confirm`)),
		chromedp.WaitVisible(chromedp.CSS(`#d-list li[data-kind="monitor_stopped"]`)),
		chromedp.WaitNotPresent(chromedp.CSS(row+` button.stop`)))
	var got monitors.Monitor
	if err := agent.Request(bg, monitors.ActionGet, []byte(`{"monitor_id":"`+m.ID+`"}`), &got); err != nil || got.StopReason != monitors.ReasonStopped {
		t.Fatalf("after Stop: %+v %v", got, err)
	}
	var stops int
	for _, env := range agentInbox(t, nc, "mon") {
		if env.Kind == subjects.KindMonitorStopped && strings.Contains(env.Text, "it was stopped") {
			stops++
		}
	}
	if stops != 1 {
		t.Fatalf("monitor_stopped envelopes: %d", stops)
	}
	screenshot(t, ctx, artifacts(t), "console-monitors.png")
}
