package monitors_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/monitors"
	"github.com/chime-nats/chime/quotas"
	"github.com/chime-nats/chime/subjects"
)

// TestURLPolicyRefusesWhatIsNotOpen: thinking as an attacker, an agent
// names URLs that look like an allowed prefix and are not (a host suffix,
// another port or scheme, a path next to the allowed one, dot segments,
// credentials): each is refused with its code and message; what the
// operator opened is allowed.
func TestURLPolicyRefusesWhatIsNotOpen(t *testing.T) {
	p, err := monitors.NewURLPolicy([]string{"https://ok.example.com/api", " https://hooks.example.com/agents/{agent}/ ", "wss://stream.example.com:8443/", "http://127.0.0.1:8080", ""})
	if err != nil {
		t.Fatal(err)
	}
	web, ws := p.Checker(monitors.SourceHTTP), p.Checker(monitors.SourceWS)
	for _, ok := range []string{
		"https://ok.example.com/api", "https://ok.example.com/api/", "https://ok.example.com/api/v1/status?x=1",
		"https://OK.example.com:443/api/x", "https://hooks.example.com/agents/a1/feed", "http://127.0.0.1:8080/", "http://127.0.0.1:8080",
	} {
		if err := web.Check("a1", ok); err != nil {
			t.Errorf("http %s: %v", ok, err)
		}
	}
	if err := ws.Check("a1", "wss://stream.example.com:8443/events?token=x"); err != nil {
		t.Errorf("ws: %v", err)
	}
	const notWithin = "is not within the URLs open to monitors (CHIME_MONITOR_URLS: https://ok.example.com/api, https://hooks.example.com/agents/{agent}/, wss://stream.example.com:8443/, http://127.0.0.1:8080)"
	for _, tc := range []struct {
		c          monitors.Checker
		url        string
		code, text string
	}{
		{web, "https://ok.example.com.evil.net/api", monitors.CodeURLNotAllowed, "URL https://ok.example.com.evil.net/api " + notWithin},
		{web, "https://evil.net/api?https://ok.example.com/api", monitors.CodeURLNotAllowed, "URL https://evil.net/api " + notWithin},
		{web, "https://ok.example.com:8443/api", monitors.CodeURLNotAllowed, notWithin},
		{web, "http://ok.example.com/api", monitors.CodeURLNotAllowed, notWithin},
		{web, "https://ok.example.com/apix", monitors.CodeURLNotAllowed, notWithin},
		{web, "https://ok.example.com/", monitors.CodeURLNotAllowed, notWithin},
		{web, "https://hooks.example.com/agents/a2/feed", monitors.CodeURLNotAllowed, notWithin},
		{web, "https://hooks.example.com/agents/a1", monitors.CodeURLNotAllowed, notWithin},
		{web, "http://127.0.0.2:8080/", monitors.CodeURLNotAllowed, notWithin},
		{web, "http://2130706433:8080/", monitors.CodeURLNotAllowed, notWithin},
		{web, "http://127.0.0.1/", monitors.CodeURLNotAllowed, notWithin},
		{web, "https://ok.example.com/api/../admin", subjects.CodeInvalidRequest, "no . or .. segments"},
		{web, "https://ok.example.com/api/%2e%2e/admin", subjects.CodeInvalidRequest, "no . or .. segments"},
		{web, "https://ok.example.com/api%2f..%2fadmin", subjects.CodeInvalidRequest, "encoded slashes"},
		{web, "https://user:pw@ok.example.com/api", subjects.CodeInvalidRequest, "must carry no user or password"},
		{web, "https://ok.example.com@evil.net/api", subjects.CodeInvalidRequest, "must carry no user or password"},
		{web, "https://ok.example.com/api#x", subjects.CodeInvalidRequest, "no #fragment"},
		{web, "ftp://ok.example.com/api", subjects.CodeInvalidRequest, "http must be a http:// or https:// URL, not ftp://"},
		{web, "wss://stream.example.com:8443/", subjects.CodeInvalidRequest, "http must be a http:// or https:// URL, not wss://"},
		{web, "/api", subjects.CodeInvalidRequest, "must be an absolute"},
		{web, "https://ok.example.com/" + strings.Repeat("x", 2048), subjects.CodeInvalidRequest, "at most 2048 bytes"},
		{ws, "https://ok.example.com/api", subjects.CodeInvalidRequest, "ws must be a ws:// or wss:// URL, not https://"},
		{ws, "wss://ok.example.com/api", monitors.CodeURLNotAllowed, notWithin},
		{ws, "ws://stream.example.com:8443/", monitors.CodeURLNotAllowed, notWithin},
	} {
		err := tc.c.Check("a1", tc.url)
		var wire *subjects.Error
		if !errors.As(err, &wire) || wire.Code != tc.code || !strings.Contains(wire.Message, tc.text) {
			t.Errorf("%.80s: %v, want %s %q", tc.url, err, tc.code, tc.text)
		}
		if tc.code == monitors.CodeURLNotAllowed && wire != nil && wire.Status != 403 {
			t.Errorf("%s: status %d", tc.url, wire.Status)
		}
	}
	none, _ := monitors.NewURLPolicy(nil)
	if err := none.Checker(monitors.SourceHTTP).Check("a1", "https://ok.example.com/api"); err == nil ||
		!strings.Contains(err.Error(), "no URL is open to monitors here (CHIME_MONITOR_URLS is empty)") {
		t.Fatalf("the zero policy: %v", err)
	}
	// A prefix that cannot be compared safely fails at start.
	for _, bad := range []string{"ok.example.com", "ftp://x/", "https:///x", "https://u:p@x/", "https://x/?q=1", "https://x/#f", "https://{agent}.example.com/", "https://x/a/../b", "::"} {
		if _, err := monitors.NewURLPolicy([]string{bad}); err == nil {
			t.Errorf("allowed prefix %q accepted", bad)
		}
	}
}

// TestStartIntervalMS: interval_ms is an http source's, 30 s to a day,
// 60 s by default, kept in the record.
func TestStartIntervalMS(t *testing.T) {
	for _, tc := range []struct{ body, text string }{
		{`{"description":"d","http":"https://x/","interval_ms":29999}`, "interval_ms must be at least 30000 (30 s): a URL is polled no faster, not 29999"},
		{`{"description":"d","http":"https://x/","interval_ms":0}`, "interval_ms must be a positive integer"},
		{`{"description":"d","http":"https://x/","interval_ms":86400001}`, "interval_ms is too large: at most 86400000"},
		{`{"description":"d","ws":"wss://x/","interval_ms":30000}`, "interval_ms is for an http source only (how often its URL is polled), not a ws"},
		{`{"description":"d","command":"x","interval_ms":30000}`, "interval_ms is for an http source only"},
	} {
		_, err := monitors.DecodeStart([]byte(tc.body))
		var wire *subjects.Error
		if !errors.As(err, &wire) || wire.Code != subjects.CodeInvalidRequest || !strings.Contains(wire.Message, tc.text) {
			t.Errorf("%s: %v, want %q", tc.body, err, tc.text)
		}
	}
	e, _ := newWebEnv(t, "https://ok.example.com/")
	m := start(t, e, "a1", `{"description":"d","http":"https://ok.example.com/x"}`)
	n := start(t, e, "a1", `{"description":"d","http":"https://ok.example.com/x","interval_ms":45000}`)
	if m.IntervalMS != 60000 || n.IntervalMS != 45000 {
		t.Fatalf("interval_ms %d %d", m.IntervalMS, n.IntervalMS)
	}
	if _, err := e.store.Start(context.Background(), "a1", mustSpec(t, `{"description":"d","http":"https://evil.example.com/x"}`)); err == nil ||
		!strings.Contains(err.Error(), monitors.CodeURLNotAllowed) {
		t.Fatalf("a URL not open: %v", err)
	}
}

// newWebEnv is newEnv serving the ws and http sources under allow, on
// the wall clock (the feeds' timers are real).
func newWebEnv(t *testing.T, allow ...string) (*env, monitors.URLPolicy) {
	t.Helper()
	p, err := monitors.NewURLPolicy(allow)
	if err != nil {
		t.Fatal(err)
	}
	nc, res := natstest.Provisioned(t, natstest.Server(t))
	e := &env{nc: nc, res: res}
	e.index = monitors.NewIndex(res.JS, engine.MonitorsBucket, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.index.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.index.Stop(context.Background()) })
	e.store = monitors.NewStore(monitors.Config{
		KV: res.Monitors, JS: res.JS, Inbox: consumer.NewInbox(res.JS, engine.InboxStream, 2*time.Minute, nil),
		Now: time.Now, Retention: kvrec.Retention{JS: res.JS, After: time.Hour, Markers: time.Minute},
		Admit: quotas.New(quotas.Config{}), Count: e.index,
		Sources: map[string]monitors.Checker{monitors.SourceWS: p.Checker(monitors.SourceWS), monitors.SourceHTTP: p.Checker(monitors.SourceHTTP)},
	})
	return e, p
}

// watch runs a watcher of feeds over e, holding every shard while the
// returned owner says so (off at first).
func (e *env) watch(t *testing.T, feeds map[string]monitors.Feed) (*monitors.Watcher, *owner) {
	t.Helper()
	o := &owner{}
	w := monitors.NewWatcher(monitors.WatcherConfig{Feeds: feeds, Store: e.store, Index: e.index, Leases: o, Shards: 8, Every: 20 * time.Millisecond})
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	return w, o
}

// lines are the lines of the agent's monitor_event envelopes, in order,
// and their envelope IDs.
func (e *env) lines(t *testing.T, agentID string) ([]string, []string) {
	t.Helper()
	var out, ids []string
	for _, env := range e.inbox(t, agentID, subjects.KindMonitorEvent) {
		var d monitors.EventData
		if err := json.Unmarshal(env.Data, &d); err != nil {
			t.Fatal(err)
		}
		out = append(out, d.Lines...)
		ids = append(ids, env.ID)
	}
	return out, ids
}

// stopped waits for m to stop and returns its record.
func (e *env) stopped(t *testing.T, agentID, id string, within time.Duration) *monitors.Monitor {
	t.Helper()
	var rec *monitors.Monitor
	testwait.Until(t, within, func() (bool, string) {
		var err error
		rec, err = e.store.Get(context.Background(), agentID, id)
		if err != nil {
			return false, err.Error()
		}
		return rec.Finished() && rec.DeliveredAt != nil, fmt.Sprintf("%+v", rec)
	}, "the monitor stops")
	return rec
}

// wsServer is a WebSocket server: each connection runs serve.
func wsServer(t *testing.T, serve func(ctx context.Context, c *websocket.Conn, n int)) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var conns atomic.Int64
	var wg sync.WaitGroup
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		wg.Add(1)
		defer wg.Done()
		defer func() { _ = c.CloseNow() }()
		serve(r.Context(), c, int(conns.Add(1)))
	}))
	t.Cleanup(func() { srv.Close(); wg.Wait() })
	return srv, &conns
}

// TestWebSocketMonitor: each text frame's lines are events, in order, a
// frame of several lines giving several; match applies; a frame is cut at
// 64 KiB, and a line says so; a binary frame is one line saying its size; the server's close stops the monitor,
// source_ended with the close code.
func TestWebSocketMonitor(t *testing.T) {
	big := "ev big " + strings.Repeat("x", 70000)
	srv, _ := wsServer(t, func(ctx context.Context, c *websocket.Conn, _ int) {
		for _, f := range []string{"ev one", "noise", "ev two\r\nev three\n\nnoise again\n", "ev four", big} {
			if err := c.Write(ctx, websocket.MessageText, []byte(f)); err != nil {
				return
			}
		}
		if err := c.Write(ctx, websocket.MessageBinary, []byte{1, 2, 3}); err != nil {
			return
		}
		_ = c.Close(4001, "build finished")
	})
	e, policy := newWebEnv(t, "ws://"+srv.Listener.Addr().String()+"/feed")
	_, o := e.watch(t, map[string]monitors.Feed{monitors.SourceWS: monitors.WSFeed{Policy: policy}})
	m := start(t, e, "a1", `{"description":"builds","ws":"ws://`+srv.Listener.Addr().String()+`/feed/x?token=t","match":"^ev|binary|frame cut"}`)
	o.all.Store(true)
	rec := e.stopped(t, "a1", m.ID, 10*time.Second)
	if rec.StopReason != monitors.ReasonSourceEnded || rec.ExitCode == nil || *rec.ExitCode != 4001 {
		t.Fatalf("stopped: %+v", rec)
	}
	got, _ := e.lines(t, "a1")
	// The big frame's one line is cut to 2048 bytes too, as any line.
	if len(got) == 7 && strings.HasPrefix(got[4], "ev big xxx") && strings.HasSuffix(got[4], "bytes cut]") {
		got[4] = "ev big (cut)"
	}
	want := []string{"ev one", "ev two", "ev three", "ev four", "ev big (cut)",
		fmt.Sprintf("[frame cut at 65536 bytes: %d more not shown]", len(big)-monitors.MaxWebBody), "binary frame of 3 bytes (not shown)"}
	if !slices.Equal(got, want) || rec.Filtered != 2 {
		t.Fatalf("lines %q, want %q; filtered %d", got, want, rec.Filtered)
	}
	if envs := e.inbox(t, "a1", subjects.KindMonitorStopped); len(envs) != 1 || !strings.Contains(envs[0].Text, "exit code 4001") {
		t.Fatalf("monitor_stopped: %+v", envs)
	}
}

// TestWebSocketDownIsRetriedThenEnds: a WebSocket whose handshake fails
// is dialled again, with backoff, until it has failed for RetryFor; then
// the monitor stops, source_ended without a code.
func TestWebSocketDownIsRetriedThenEnds(t *testing.T) {
	var dials atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dials.Add(1)
		http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	e, policy := newWebEnv(t, "ws://"+srv.Listener.Addr().String()+"/")
	_, o := e.watch(t, map[string]monitors.Feed{monitors.SourceWS: monitors.WSFeed{Policy: policy, RetryFor: 1500 * time.Millisecond}})
	m := start(t, e, "a1", `{"description":"down","ws":"ws://`+srv.Listener.Addr().String()+`/"}`)
	began := time.Now()
	o.all.Store(true)
	rec := e.stopped(t, "a1", m.ID, 10*time.Second)
	if rec.StopReason != monitors.ReasonSourceEnded || rec.ExitCode != nil || dials.Load() < 2 || time.Since(began) < 1500*time.Millisecond {
		t.Fatalf("stopped after %d dials, %v: %+v", dials.Load(), time.Since(began), rec)
	}
}

// TestWebSocketFollowsTheShard: when the shard moves away the connection
// closes; the next holder connects again and its frames are delivered
// after the first's, with no envelope ID twice.
func TestWebSocketFollowsTheShard(t *testing.T) {
	gone := make(chan int, 4)
	srv, conns := wsServer(t, func(ctx context.Context, c *websocket.Conn, n int) {
		if err := c.Write(ctx, websocket.MessageText, fmt.Appendf(nil, "hello from connection %d", n)); err != nil {
			return
		}
		_, _, err := c.Read(ctx) // until the client goes
		if err != nil {
			gone <- n
		}
	})
	e, policy := newWebEnv(t, "ws://"+srv.Listener.Addr().String()+"/")
	w, o := e.watch(t, map[string]monitors.Feed{monitors.SourceWS: monitors.WSFeed{Policy: policy}})
	start(t, e, "a1", `{"description":"hello","ws":"ws://`+srv.Listener.Addr().String()+`/"}`)
	o.all.Store(true)
	testwait.Eventually(t, 10*time.Second, func() bool { l, _ := e.lines(t, "a1"); return len(l) == 1 }, "the first connection's frame")
	o.all.Store(false)
	select {
	case n := <-gone:
		if n != 1 {
			t.Fatalf("connection %d closed", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the connection stayed open after the shard went")
	}
	testwait.Eventually(t, 5*time.Second, func() bool { return w.Watching() == 0 })
	o.all.Store(true)
	testwait.Eventually(t, 10*time.Second, func() bool { l, _ := e.lines(t, "a1"); return len(l) == 2 }, "the second connection's frame")
	got, ids := e.lines(t, "a1")
	if !slices.Equal(got, []string{"hello from connection 1", "hello from connection 2"}) || ids[0] == ids[1] || conns.Load() != 2 {
		t.Fatalf("lines %q ids %q conns %d", got, ids, conns.Load())
	}
}

// pollServer answers its body and status as the test sets them, and
// records when it was polled.
type pollServer struct {
	mu     sync.Mutex
	status int
	body   string
	polls  []time.Time
}

func (p *pollServer) set(status int, body string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.status, p.body = status, body
}

func (p *pollServer) times() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.polls)
}

func (p *pollServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	p.polls = append(p.polls, time.Now())
	status, body := p.status, p.body
	p.mu.Unlock()
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

// fastPolls sets m's interval below the 30 s floor of requests, as a
// record edited in place, for a feed whose MinInterval lets it.
func fastPolls(t *testing.T, e *env, m *monitors.Monitor, every time.Duration) {
	t.Helper()
	if _, _, err := kvrec.Update(context.Background(), e.res.Monitors, monitors.Key(m.AgentID, m.ID), false, func(r *monitors.Monitor) (bool, error) {
		r.IntervalMS = every.Milliseconds()
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestHTTPPollMonitor: the first poll delivers the body; polls that find
// it unchanged deliver nothing; a change delivers the new body's lines; a
// 500 says HTTP 500 first; a redirect out of the allowed prefixes is
// refused, one error line however often it repeats.
func TestHTTPPollMonitor(t *testing.T) {
	ps := &pollServer{status: 200, body: "status: green\n"}
	mux := http.NewServeMux()
	mux.Handle("/api/status", ps)
	mux.Handle("/api/moved", http.RedirectHandler("/elsewhere", http.StatusFound))
	mux.Handle("/api/hop", http.RedirectHandler("/api/status", http.StatusFound))
	var loops atomic.Int64
	mux.HandleFunc("/api/loop/", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, fmt.Sprintf("/api/loop/%d", loops.Add(1)), http.StatusFound)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	base := "http://" + srv.Listener.Addr().String()
	e, policy := newWebEnv(t, base+"/api")
	_, o := e.watch(t, map[string]monitors.Feed{monitors.SourceHTTP: monitors.HTTPFeed{Policy: policy, Store: e.store, MinInterval: 50 * time.Millisecond}})
	m := start(t, e, "a1", `{"description":"status","http":"`+base+`/api/status","interval_ms":30000}`)
	fastPolls(t, e, m, 100*time.Millisecond)
	o.all.Store(true)
	testwait.Eventually(t, 10*time.Second, func() bool { l, _ := e.lines(t, "a1"); return len(l) == 1 }, "the first poll")
	n := len(ps.times())
	testwait.Eventually(t, 10*time.Second, func() bool { return len(ps.times()) >= n+3 }, "polls")
	if l, _ := e.lines(t, "a1"); !slices.Equal(l, []string{"status: green"}) {
		t.Fatalf("unchanged polls delivered: %q", l)
	}
	ps.set(200, "status: red\nfailing: ci\n")
	testwait.Eventually(t, 10*time.Second, func() bool { l, _ := e.lines(t, "a1"); return len(l) == 3 }, "the change")
	ps.set(500, "boom")
	testwait.Eventually(t, 10*time.Second, func() bool { l, _ := e.lines(t, "a1"); return len(l) == 5 }, "the 500")
	got, _ := e.lines(t, "a1")
	if want := []string{"status: green", "status: red", "failing: ci", "HTTP 500", "boom"}; !slices.Equal(got, want) {
		t.Fatalf("lines %q, want %q", got, want)
	}

	// A redirect within the prefixes is followed, 3 at most; one out of
	// them is not.
	hop := start(t, e, "a2", `{"description":"hop","http":"`+base+`/api/hop"}`)
	fastPolls(t, e, hop, 100*time.Millisecond)
	moved := start(t, e, "a3", `{"description":"moved","http":"`+base+`/api/moved"}`)
	fastPolls(t, e, moved, 100*time.Millisecond)
	loop := start(t, e, "a4", `{"description":"loop","http":"`+base+`/api/loop/0"}`)
	fastPolls(t, e, loop, time.Hour)
	testwait.Eventually(t, 10*time.Second, func() bool { l, _ := e.lines(t, "a4"); return len(l) == 1 }, "the redirects cut")
	if l, _ := e.lines(t, "a4"); l[0] != "error: stopped after 3 redirects" || loops.Load() != 4 {
		t.Fatalf("redirect loop: %q after %d", l, loops.Load())
	}
	testwait.Eventually(t, 10*time.Second, func() bool { l, _ := e.lines(t, "a2"); return len(l) == 2 }, "the redirect followed")
	if l, _ := e.lines(t, "a2"); !slices.Equal(l, []string{"HTTP 500", "boom"}) {
		t.Fatalf("redirect within: %q", l)
	}
	testwait.Eventually(t, 10*time.Second, func() bool { l, _ := e.lines(t, "a3"); return len(l) == 1 }, "the redirect refused")
	time.Sleep(500 * time.Millisecond) // several polls: the same error is one line
	l, _ := e.lines(t, "a3")
	want := "error: redirect to " + base + "/elsewhere refused: URL " + base + "/elsewhere is not within the URLs open to monitors (CHIME_MONITOR_URLS: " + base + "/api)"
	if len(l) != 1 || l[0] != want {
		t.Fatalf("redirect out: %q, want %q", l, want)
	}
}

// TestHTTPPollFollowsTheShard: a monitor that moves to another holder
// (here: the shard goes and comes back) neither delivers an unchanged
// body again nor polls sooner than its interval after the last poll,
// whether that poll changed something or not.
func TestHTTPPollFollowsTheShard(t *testing.T) {
	ps := &pollServer{status: 200, body: "v1"}
	srv := httptest.NewServer(ps)
	defer srv.Close()
	base := "http://" + srv.Listener.Addr().String()
	e, policy := newWebEnv(t, base+"/")
	w, o := e.watch(t, map[string]monitors.Feed{monitors.SourceHTTP: monitors.HTTPFeed{Policy: policy, Store: e.store, MinInterval: 50 * time.Millisecond}})
	m := start(t, e, "a1", `{"description":"v","http":"`+base+`/v"}`)
	const every = 1500 * time.Millisecond
	fastPolls(t, e, m, every)
	move := func() {
		t.Helper()
		o.all.Store(false)
		testwait.Eventually(t, 5*time.Second, func() bool { return w.Watching() == 0 })
		o.all.Store(true)
	}
	cursor := func() string {
		rec, err := e.store.Get(context.Background(), "a1", m.ID)
		if err != nil {
			t.Fatal(err)
		}
		return rec.Cursor
	}
	o.all.Store(true)
	// The record holds each poll once it is made ("<ms>:<hash>", the hash
	// once the batch is applied): the moves come after.
	testwait.Eventually(t, 10*time.Second, func() bool { c := cursor(); return c != "" && !strings.HasSuffix(c, ":") }, "the first poll delivered")
	first := cursor()
	move() // right after a poll that delivered
	testwait.Eventually(t, 10*time.Second, func() bool { return len(ps.times()) == 2 }, "the second poll")
	testwait.Eventually(t, 10*time.Second, func() bool { return cursor() != first }, "the second poll kept")
	move() // right after a poll that changed nothing
	testwait.Eventually(t, 10*time.Second, func() bool { return len(ps.times()) == 3 }, "the third poll")
	polls := ps.times()
	for i := 1; i < len(polls); i++ {
		if gap := polls[i].Sub(polls[i-1]); gap < every-50*time.Millisecond {
			t.Errorf("poll %d came %v after the one before, under the interval %v", i, gap, every)
		}
	}
	if l, _ := e.lines(t, "a1"); !slices.Equal(l, []string{"v1"}) {
		t.Fatalf("lines %q", l)
	}
}
