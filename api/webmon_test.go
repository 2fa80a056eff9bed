package api_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/monitors"
	"github.com/chime-nats/chime/subjects"
)

// TestWebMonitorsOverNATS: with CHIME_MONITOR_URLS open, a replica polls
// an http monitor's URL and reads a ws monitor's WebSocket (the feeds
// wired in the replica), whose close stops it with its code; a URL
// outside the prefixes is refused.
func TestWebMonitorsOverNATS(t *testing.T) {
	var wg sync.WaitGroup
	mux := http.NewServeMux()
	mux.HandleFunc("/status", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "status: ok\n") })
	mux.HandleFunc("/events", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		wg.Add(1)
		defer wg.Done()
		defer func() { _ = c.CloseNow() }()
		if err := c.Write(r.Context(), websocket.MessageText, []byte("build 7 failed")); err != nil {
			return
		}
		_ = c.Close(websocket.StatusNormalClosure, "done")
	})
	srv := httptest.NewServer(mux)
	defer func() { srv.Close(); wg.Wait() }()
	host := srv.Listener.Addr().String()
	_, nc := startChimeWith(t, io.Discard, func(c *config.Config) { c.MonitorURLs = "http://" + host + "/status,ws://" + host + "/events" })
	ctx := context.Background()
	c, err := client.New(nc, "agent-w")
	if err != nil {
		t.Fatal(err)
	}
	err = c.Request(ctx, monitors.ActionStart, []byte(`{"description":"d","http":"http://`+host+`/other"}`), &struct{}{})
	if !strings.Contains(err.Error(), monitors.CodeURLNotAllowed) {
		t.Fatalf("a URL not open: %v", err)
	}
	var poll, ws monitors.Monitor
	if err := c.Request(ctx, monitors.ActionStart, []byte(`{"description":"status","http":"http://`+host+`/status"}`), &poll); err != nil {
		t.Fatal(err)
	}
	if err := c.Request(ctx, monitors.ActionStart, []byte(`{"description":"ci","ws":"ws://`+host+`/events"}`), &ws); err != nil {
		t.Fatal(err)
	}
	if poll.IntervalMS != 60000 {
		t.Fatalf("interval_ms %d", poll.IntervalMS)
	}
	testwait.Eventually(t, 15*time.Second, func() bool {
		var gotPoll, gotWS bool
		for _, env := range fetchKind(t, c, subjects.KindMonitorEvent) {
			gotPoll = gotPoll || strings.Contains(env.Text, "status: ok")
			gotWS = gotWS || strings.Contains(env.Text, "build 7 failed")
		}
		return gotPoll && gotWS
	}, "the poll's and the frame's lines")
	testwait.Eventually(t, 15*time.Second, func() bool {
		var m monitors.Monitor
		err := c.Request(ctx, monitors.ActionGet, []byte(`{"monitor_id":"`+ws.ID+`"}`), &m)
		return err == nil && m.StopReason == monitors.ReasonSourceEnded && m.ExitCode != nil && *m.ExitCode == 1000
	}, "the WebSocket's close stops its monitor")
}
