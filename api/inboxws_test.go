package api_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/deliveries"
	"github.com/chime-nats/chime/subjects"
)

// dialInbox opens an inbox WebSocket at base+path (ws:// for http://) with
// headers (name, value, ...); it fails the test unless the upgrade is
// accepted. The connection is closed at the test's end.
func dialInbox(t *testing.T, base, path string, header ...string) *websocket.Conn {
	t.Helper()
	c, res, err := dialWS(t, base, path, header...)
	if err != nil {
		var body []byte
		if res != nil {
			body, _ = io.ReadAll(res.Body)
		}
		t.Fatalf("dial %s: %v %s", path, err, body)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c
}

func dialWS(t *testing.T, base, path string, header ...string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	h := http.Header{}
	for i := 0; i+1 < len(header); i += 2 {
		h.Set(header[i], header[i+1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+path, &websocket.DialOptions{HTTPHeader: h})
}

// frame reads the next text frame, within 10 s.
func frame(t *testing.T, c *websocket.Conn) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	typ, b, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("read a frame: %v", err)
	}
	if typ != websocket.MessageText {
		t.Fatalf("a %v frame: %q", typ, b)
	}
	return b
}

func deliveryFrame(t *testing.T, c *websocket.Conn) deliveries.InboxDelivery {
	t.Helper()
	b := frame(t, c)
	var d deliveries.InboxDelivery
	if err := json.Unmarshal(b, &d); err != nil || d.Seq == 0 || len(d.Envelope) == 0 {
		t.Fatalf("frame %s: %v", b, err)
	}
	return d
}

// TestInboxWebSocket: the WebSocket feed sends one text frame per
// delivery: from the agent's cursor, or after ?since or Last-Event-ID,
// then live; ?format=text sends the line chime inbox watch prints; frames
// do not move the cursor.
func TestInboxWebSocket(t *testing.T) {
	r, nc := startChime(t)
	base := "http://" + r.HTTPAddr()
	deliveriesFor(t, nc, "ws", 4)
	c, _ := client.New(nc, "ws")
	ctx := context.Background()
	all, err := c.FetchInbox(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.AckInbox(ctx, all.Deliveries[0].Seq); err != nil {
		t.Fatal(err)
	}

	fromCursor := dialInbox(t, base, "/api/agents/ws/inbox/ws")
	for _, want := range all.Deliveries[1:] {
		if d := deliveryFrame(t, fromCursor); d.Seq != want.Seq || string(d.Envelope) != string(want.Envelope) {
			t.Fatalf("from the cursor: %d %s, want %d %s", d.Seq, d.Envelope, want.Seq, want.Envelope)
		}
	}
	since := dialInbox(t, base, "/api/agents/ws/inbox/ws?since="+strconv.FormatUint(all.Deliveries[2].Seq, 10))
	if d := deliveryFrame(t, since); d.Seq != all.Deliveries[3].Seq {
		t.Fatalf("?since: %d, want %d", d.Seq, all.Deliveries[3].Seq)
	}
	header := dialInbox(t, base, "/api/agents/ws/inbox/ws", "Last-Event-ID", strconv.FormatUint(all.Deliveries[2].Seq, 10))
	if d := deliveryFrame(t, header); d.Seq != all.Deliveries[3].Seq {
		t.Fatalf("Last-Event-ID: %d, want %d", d.Seq, all.Deliveries[3].Seq)
	}
	text := dialInbox(t, base, "/api/agents/ws/inbox/ws?format=text&since="+strconv.FormatUint(all.Deliveries[2].Seq, 10))
	if got, want := string(frame(t, text)), string(deliveries.Line(all.Deliveries[3])); got != want || !strings.Contains(got, ` timer_fired timer_`) {
		t.Fatalf("a text frame: %q, want %q", got, want)
	}

	// A live delivery reaches every feed.
	tm, err := c.CreateTimer(ctx, 1, 0, "live\none")
	if err != nil {
		t.Fatal(err)
	}
	for _, feed := range []*websocket.Conn{fromCursor, since, header} {
		if d := deliveryFrame(t, feed); d.Seq <= all.Deliveries[3].Seq || !strings.Contains(string(d.Envelope), tm.ID) {
			t.Fatalf("the live one: %d %s", d.Seq, d.Envelope)
		}
	}
	if line := string(frame(t, text)); !strings.HasSuffix(line, ` system: "live\none"`) {
		t.Fatalf("the live one as text: %q", line)
	}
	// Frames moved no cursor.
	if got, err := c.FetchInbox(ctx, 0, 0); err != nil || got.Acked != all.Deliveries[0].Seq {
		t.Fatalf("the cursor after the frames: %+v %v, want %d", got, err, all.Deliveries[0].Seq)
	}
}

// TestInboxWebSocketBounds: a client may not send data; a frame it sends
// ends the feed with a policy violation, and one over the read limit is
// not read at all.
func TestInboxWebSocketBounds(t *testing.T) {
	r, _ := startChime(t)
	base := "http://" + r.HTTPAddr()
	for _, tc := range []struct {
		name string
		send []byte
		want websocket.StatusCode
	}{
		{"data", []byte("hello"), websocket.StatusPolicyViolation},
		{"a large frame", make([]byte, 1<<20), websocket.StatusMessageTooBig},
	} {
		c := dialInbox(t, base, "/api/agents/quiet/inbox/ws")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		// A write of a frame the server refuses may itself fail as the
		// server closes: what matters is how the feed ends.
		_ = c.Write(ctx, websocket.MessageText, tc.send)
		_, _, err := c.Read(ctx)
		cancel()
		if got := websocket.CloseStatus(err); got != tc.want {
			t.Errorf("%s: the feed ended with %v (%v), want %v", tc.name, got, err, tc.want)
		}
	}
}

// TestInboxWebSocketBadInput: everything refused is refused before the
// upgrade, as the one JSON error shape with its status.
func TestInboxWebSocketBadInput(t *testing.T) {
	r, _ := startChime(t)
	base := "http://" + r.HTTPAddr()
	upgrade := []string{"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}
	with := func(h ...string) []string { return append(append([]string{}, upgrade...), h...) }
	for _, tc := range []struct {
		name, path string
		header     []string
		status     int
		code, msg  string
	}{
		{"no upgrade", "/api/agents/a/inbox/ws", nil, 426, "upgrade_required", "the request must ask for an upgrade"},
		{"another upgrade", "/api/agents/a/inbox/ws", []string{"Connection", "Upgrade", "Upgrade", "h2c"}, 426, "upgrade_required", "must ask for an upgrade"},
		{"version 8", "/api/agents/a/inbox/ws", with("Sec-WebSocket-Version", "8"), 426, "upgrade_required", `WebSocket version 13 is required, not "8"`},
		{"no key", "/api/agents/a/inbox/ws", with("Sec-WebSocket-Key", ""), 400, subjects.CodeInvalidRequest, "Sec-WebSocket-Key"},
		{"bad key", "/api/agents/a/inbox/ws", with("Sec-WebSocket-Key", "c2hvcnQ="), 400, subjects.CodeInvalidRequest, "Sec-WebSocket-Key"},
		{"bad since", "/api/agents/a/inbox/ws?since=-1", upgrade, 400, subjects.CodeInvalidRequest, `since (or Last-Event-ID) must be a sequence number, not "-1"`},
		{"bad Last-Event-ID", "/api/agents/a/inbox/ws", with("Last-Event-ID", "x"), 400, subjects.CodeInvalidRequest, `not "x"`},
		{"bad format", "/api/agents/a/inbox/ws?format=xml", upgrade, 400, subjects.CodeInvalidRequest, `format must be json or text, not "xml"`},
		{"bad agent", "/api/agents/bad.id/inbox/ws", upgrade, 400, subjects.CodeInvalidID, "agent_id"},
		{"another origin", "/api/agents/a/inbox/ws", with("Origin", "http://evil.example"), 403, subjects.CodeForbidden, "another origin"},
		{"a POST", "/api/agents/a/inbox/ws", upgrade, 404, "not_found", "no route for POST"},
	} {
		method := "GET"
		if strings.HasPrefix(tc.name, "a POST") {
			method = "POST"
		}
		status, body := send(t, method, base+tc.path, nil, tc.header...)
		var e struct{ Error subjects.Error }
		if status != tc.status || json.Unmarshal(body, &e) != nil || e.Error.Code != tc.code || !strings.Contains(e.Error.Message, tc.msg) {
			t.Errorf("%s: %d %s, want %d %s containing %q", tc.name, status, body, tc.status, tc.code, tc.msg)
		}
	}
	// The same through a WebSocket client: the refusal is the JSON error.
	_, res, err := dialWS(t, base, "/api/agents/a/inbox/ws?since=x")
	if err == nil || res == nil || res.StatusCode != 400 {
		t.Fatalf("a WebSocket client with a bad since: %v %+v", err, res)
	}
	if b, _ := io.ReadAll(res.Body); !strings.Contains(string(b), `"code":"invalid_request"`) {
		t.Fatalf("a WebSocket client with a bad since: %s", b)
	}
}

// startGuarded runs a replica whose HTTP routes need a token and returns
// its base URL, a connection, and the Authorization values of its one
// operator and of agentID (a token issued to it).
func startGuarded(t *testing.T, agentID string) (base string, nc *nats.Conn, op, agent string) {
	t.Helper()
	const token = "operator-guarded-token"
	h := sha256.Sum256([]byte(token))
	file := filepath.Join(t.TempDir(), "operators")
	if err := os.WriteFile(file, []byte(hex.EncodeToString(h[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, nc := startChimeWith(t, io.Discard, func(c *config.Config) { c.OperatorTokensFile = file })
	c, _ := client.New(nc, agentID)
	issued, err := c.IssueToken(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return "http://" + r.HTTPAddr(), nc, "Bearer " + token, "Bearer " + issued.Token
}

// TestInboxWebSocketGuarded: with operator tokens, the agent's own token
// or an operator's opens its feed; none is 401, another agent's 403.
func TestInboxWebSocketGuarded(t *testing.T) {
	base, nc, op, agent := startGuarded(t, "guarded")
	c, _ := client.New(nc, "guarded")
	for _, tc := range []struct {
		name, path, auth string
		status           int
		code             string
	}{
		{"no token", "/api/agents/guarded/inbox/ws", "", 401, subjects.CodeUnauthorized},
		{"a bad token", "/api/agents/guarded/inbox/ws", "Bearer nope", 401, subjects.CodeUnauthorized},
		{"another agent's", "/api/agents/other/inbox/ws", agent, 403, subjects.CodeForbidden},
	} {
		_, res, err := dialWS(t, base, tc.path, "Authorization", tc.auth)
		if err == nil || res == nil || res.StatusCode != tc.status {
			t.Errorf("%s: %v %+v, want %d", tc.name, err, res, tc.status)
			continue
		}
		if b, _ := io.ReadAll(res.Body); !strings.Contains(string(b), `"code":"`+tc.code+`"`) {
			t.Errorf("%s: %s, want %s", tc.name, b, tc.code)
		}
	}
	if _, err := c.CreateTimer(context.Background(), 1, 0, "for the agent"); err != nil {
		t.Fatal(err)
	}
	for _, auth := range []string{agent, op} {
		if d := deliveryFrame(t, dialInbox(t, base, "/api/agents/guarded/inbox/ws", "Authorization", auth)); !strings.Contains(string(d.Envelope), "for the agent") {
			t.Fatalf("the agent's feed: %s", d.Envelope)
		}
	}
}

// TestInboxWebSocketEndsWithTheGateway: an open feed ends, with "going
// away", when the replica stops, and does not hold the shutdown.
func TestInboxWebSocketEndsWithTheGateway(t *testing.T) {
	r, _ := startChime(t)
	c := dialInbox(t, "http://"+r.HTTPAddr(), "/api/agents/quiet/inbox/ws")
	stopped := make(chan struct{})
	go func() { r.Stop(context.Background()); close(stopped) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _, err := c.Read(ctx)
	if got := websocket.CloseStatus(err); got != websocket.StatusGoingAway {
		t.Fatalf("the feed ended with %v (%v), want going away", got, err)
	}
	select {
	case <-stopped:
	case <-time.After(15 * time.Second):
		t.Fatal("the replica did not stop with a feed open")
	}
}
