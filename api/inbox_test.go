package api_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/deliveries"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/subjects"
)

// TestInboxFetchAndAck: an agent reads its own deliveries through chime,
// oldest first; what it has not acked comes again, what it acked does not,
// and other agents' deliveries never show.
func TestInboxFetchAndAck(t *testing.T) {
	_, nc := startChime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ann, _ := client.New(nc, "ann")
	ben, _ := client.New(nc, "ben")
	for i := range 3 {
		if _, err := ann.CreateTimer(ctx, int64(20+10*i), 0, "ann"); err != nil {
			t.Fatal(err)
		}
		if _, err := ben.CreateTimer(ctx, 20, 0, "ben"); err != nil {
			t.Fatal(err)
		}
	}
	var first *deliveries.InboxFetchReply
	for deadline := time.Now().Add(10 * time.Second); ; {
		var err error
		if first, err = ann.FetchInbox(ctx, 0, time.Second); err != nil {
			t.Fatal(err)
		}
		if len(first.Deliveries) == 3 || time.Now().After(deadline) {
			break
		}
	}
	if len(first.Deliveries) != 3 || first.Acked != 0 {
		t.Fatalf("first fetch: %+v", first)
	}
	for i, d := range first.Deliveries {
		var env subjects.Envelope
		if err := json.Unmarshal(d.Envelope, &env); err != nil || env.AgentID != "ann" || env.Kind != subjects.KindTimerFired {
			t.Fatalf("delivery %d: %s %v", i, d.Envelope, err)
		}
		if i > 0 && d.Seq <= first.Deliveries[i-1].Seq {
			t.Fatalf("out of order: %+v", first.Deliveries)
		}
	}
	// Not acked: the same again; max bounds it; after reads beyond.
	if again, err := ann.FetchInbox(ctx, 2, 0); err != nil || len(again.Deliveries) != 2 || again.Deliveries[0].Seq != first.Deliveries[0].Seq {
		t.Fatalf("again: %+v %v", again, err)
	}
	var beyond deliveries.InboxFetchReply
	if err := subjects.DecodeReply(request(t, nc, subjects.Agent("ann", deliveries.ActionInboxFetch),
		`{"after":`+jsonNum(first.Deliveries[1].Seq)+`}`).Data, &beyond); err != nil || len(beyond.Deliveries) != 1 || beyond.Deliveries[0].Seq != first.Deliveries[2].Seq {
		t.Fatalf("after the 2nd: %+v %v", beyond, err)
	}
	// Acked up to the 2nd: only the 3rd comes; an older ack moves nothing.
	if acked, err := ann.AckInbox(ctx, first.Deliveries[1].Seq); err != nil || acked != first.Deliveries[1].Seq {
		t.Fatalf("ack: %d %v", acked, err)
	}
	if acked, err := ann.AckInbox(ctx, first.Deliveries[0].Seq); err != nil || acked != first.Deliveries[1].Seq {
		t.Fatalf("an older ack: %d %v", acked, err)
	}
	if rest, err := ann.FetchInbox(ctx, 0, 0); err != nil || len(rest.Deliveries) != 1 || rest.Deliveries[0].Seq != first.Deliveries[2].Seq ||
		rest.Acked != first.Deliveries[1].Seq {
		t.Fatalf("after the ack: %+v %v", rest, err)
	}
	// A wait ends with the next delivery.
	if _, err := ann.AckInbox(ctx, first.Deliveries[2].Seq); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	go func() {
		time.Sleep(300 * time.Millisecond)
		_, _ = ann.CreateTimer(context.Background(), 1, 0, "late")
	}()
	waited, err := ann.FetchInbox(ctx, 0, deliveries.MaxInboxWait)
	if err != nil || len(waited.Deliveries) != 1 || time.Since(start) > 4*time.Second {
		t.Fatalf("a waiting fetch: %+v %v after %v", waited, err, time.Since(start))
	}
	// Another agent sees only its own.
	if empty, err := ben.FetchInbox(ctx, 0, 0); err != nil || len(empty.Deliveries) != 3 {
		t.Fatalf("ben's: %+v %v", empty, err)
	}
}

func jsonNum(n uint64) string { b, _ := json.Marshal(n); return string(b) }

// TestInboxBadInput: every refusal names what is wrong, and moves nothing.
func TestInboxBadInput(t *testing.T) {
	_, nc := startChime(t)
	for _, c := range []struct{ action, body, code, msg string }{
		{deliveries.ActionInboxFetch, `{"max":0}`, subjects.CodeInvalidRequest, "max must be a whole number from 1 to 256"},
		{deliveries.ActionInboxFetch, `{"max":257}`, subjects.CodeInvalidRequest, "max must be a whole number from 1 to 256"},
		{deliveries.ActionInboxFetch, `{"max":1.5}`, subjects.CodeInvalidRequest, "max must be a whole number from 1 to 256"},
		{deliveries.ActionInboxFetch, `{"wait_ms":60000}`, subjects.CodeInvalidRequest, "wait_ms must be a whole number from 0 to 5000"},
		{deliveries.ActionInboxFetch, `{"after":-1}`, subjects.CodeInvalidRequest, ""},
		{deliveries.ActionInboxFetch, `{"consumer":"x"}`, subjects.CodeInvalidRequest, ""},
		{deliveries.ActionInboxFetch, `[]`, subjects.CodeInvalidJSON, ""},
		{deliveries.ActionInboxAck, `{}`, subjects.CodeInvalidRequest, "seq is required"},
		{deliveries.ActionInboxAck, `{"seq":0}`, subjects.CodeInvalidRequest, ""},
		{deliveries.ActionInboxAck, `{"seq":"5"}`, subjects.CodeInvalidRequest, ""},
		{deliveries.ActionInboxAck, `{"seq":99999}`, subjects.CodeInvalidRequest, "seq 99999 is beyond the inbox's last delivery 0"},
	} {
		assertError(t, c.action+" "+c.body, request(t, nc, subjects.Agent("cal", c.action), c.body).Data, c.code, c.msg)
	}
	var r deliveries.InboxFetchReply
	if err := subjects.DecodeReply(request(t, nc, subjects.Agent("cal", deliveries.ActionInboxFetch), ``).Data, &r); err != nil || r.Acked != 0 || len(r.Deliveries) != 0 {
		t.Fatalf("after the refusals: %+v %v", r, err)
	}
}

// deliveriesFor has n timers fire into agentID's inbox and waits until
// they are there.
func deliveriesFor(t *testing.T, nc *nats.Conn, agentID string, n int) {
	t.Helper()
	c, _ := client.New(nc, agentID)
	for i := range n {
		if _, err := c.CreateTimer(context.Background(), int64(20+i), 0, fmt.Sprint("d", i)); err != nil {
			t.Fatal(err)
		}
	}
	testwait.Eventually(t, 5*time.Second, func() bool {
		r, err := c.FetchInbox(context.Background(), deliveries.MaxInboxFetch, 0)
		return err == nil && len(r.Deliveries) == n
	})
}

// TestInboxHTTP: an agent reads its inbox reliably over HTTP with its own
// token, as over NATS: fetch from the cursor, ack, the rest; an operator
// may do both for any agent; another agent's inbox is refused.
func TestInboxHTTP(t *testing.T) {
	const operator = "operator-inbox-token"
	h := sha256.Sum256([]byte(operator))
	file := filepath.Join(t.TempDir(), "operators")
	if err := os.WriteFile(file, []byte(hex.EncodeToString(h[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, nc := startChimeWith(t, io.Discard, func(c *config.Config) { c.OperatorTokensFile = file })
	base := "http://" + r.HTTPAddr()
	op := []string{"Authorization", "Bearer " + operator}
	deliveriesFor(t, nc, "hana", 3)
	c, _ := client.New(nc, "hana")
	issued, err := c.IssueToken(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	agent := []string{"Authorization", "Bearer " + issued.Token}

	fetch := func(query string, header []string) deliveries.InboxFetchReply {
		t.Helper()
		status, body := get(t, base+"/api/agents/hana/inbox/fetch"+query, header...)
		var r deliveries.InboxFetchReply
		if status != 200 || json.Unmarshal(body, &r) != nil {
			t.Fatalf("fetch%s: %d %s", query, status, body)
		}
		return r
	}
	first := fetch("", agent)
	if len(first.Deliveries) != 3 || first.Acked != 0 {
		t.Fatalf("first fetch: %+v", first)
	}
	if two := fetch("?max=2", agent); len(two.Deliveries) != 2 || two.Deliveries[0].Seq != first.Deliveries[0].Seq {
		t.Fatalf("max=2: %+v", two)
	}
	if beyond := fetch("?after="+jsonNum(first.Deliveries[1].Seq), op); len(beyond.Deliveries) != 1 || beyond.Deliveries[0].Seq != first.Deliveries[2].Seq {
		t.Fatalf("after the 2nd, as the operator: %+v", beyond)
	}
	status, body := post(t, base+"/api/agents/hana/inbox/ack", "application/json", []byte(`{"seq":`+jsonNum(first.Deliveries[1].Seq)+`}`), agent...)
	var acked deliveries.InboxAckReply
	if status != 200 || json.Unmarshal(body, &acked) != nil || acked.Acked != first.Deliveries[1].Seq {
		t.Fatalf("ack: %d %s", status, body)
	}
	if rest := fetch("", op); len(rest.Deliveries) != 1 || rest.Acked != first.Deliveries[1].Seq {
		t.Fatalf("after the ack: %+v", rest)
	}
	// The NATS read sees the same cursor.
	if r, err := c.FetchInbox(context.Background(), 0, 0); err != nil || r.Acked != first.Deliveries[1].Seq {
		t.Fatalf("over NATS: %+v %v", r, err)
	}
	// A wait ends with the next delivery.
	if status, _ := post(t, base+"/api/agents/hana/inbox/ack", "application/json", []byte(`{"seq":`+jsonNum(first.Deliveries[2].Seq)+`}`), op...); status != 200 {
		t.Fatalf("operator ack: %d", status)
	}
	go func() {
		time.Sleep(200 * time.Millisecond)
		_, _ = c.CreateTimer(context.Background(), 1, 0, "late")
	}()
	if late := fetch("?wait_ms=5000", agent); len(late.Deliveries) != 1 {
		t.Fatalf("a waiting fetch: %+v", late)
	}

	for _, tc := range []struct {
		method, path string
		header       []string
		status       int
	}{
		{"GET", "/api/agents/hana/inbox/fetch", nil, 401},
		{"POST", "/api/agents/hana/inbox/ack", nil, 401},
		{"GET", "/api/agents/other/inbox/fetch", agent, 403},
		{"POST", "/api/agents/other/inbox/ack", agent, 403},
		{"POST", "/api/agents/hana/inbox/fetch", agent, 403},
		{"POST", "/api/agents/hana/notifications/mark-read", agent, 403},
		{"POST", "/api/control/agents/other/timers", agent, 403},
		// Its own routes of actions the table grants operators only.
		{"POST", "/api/control/agents/hana/token", agent, 403},
		{"GET", "/api/agents/hana/triggers", agent, 403},
		{"POST", "/api/control/agents/hana/questions/q_1/answer", agent, 403},
	} {
		if s, body := send(t, tc.method, base+tc.path, []byte(`{"seq":1}`), tc.header...); s != tc.status {
			t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, s, body, tc.status)
		}
	}
	// Its own routes of actions granted to agents: as over NATS.
	if s, body := send(t, "POST", base+"/api/control/agents/hana/timers", []byte(`{"duration_ms":600000}`), agent...); s != 201 {
		t.Errorf("an agent's own timer over HTTP: %d %s", s, body)
	}
	if r, _ := c.FetchInbox(context.Background(), 0, 0); r.Acked != first.Deliveries[2].Seq {
		t.Fatalf("the refusals moved the cursor: %+v", r)
	}
}

// TestInboxHTTPBadInput: the HTTP routes refuse what NATS refuses, in the
// same words, with the status of the error code.
func TestInboxHTTPBadInput(t *testing.T) {
	r, _ := startChime(t)
	base := "http://" + r.HTTPAddr()
	for _, tc := range []struct {
		method, path, body string
		status             int
		code, msg          string
	}{
		{"GET", "/api/agents/a/inbox/fetch?max=0", "", 400, subjects.CodeInvalidRequest, "max must be a whole number from 1 to 256"},
		{"GET", "/api/agents/a/inbox/fetch?max=257", "", 400, subjects.CodeInvalidRequest, "max must be a whole number from 1 to 256"},
		{"GET", "/api/agents/a/inbox/fetch?max=ten", "", 400, subjects.CodeInvalidRequest, "max must be a whole number from 1 to 256"},
		{"GET", "/api/agents/a/inbox/fetch?max=1.5", "", 400, subjects.CodeInvalidRequest, "max must be a whole number from 1 to 256"},
		{"GET", "/api/agents/a/inbox/fetch?wait_ms=60000", "", 400, subjects.CodeInvalidRequest, "wait_ms must be a whole number from 0 to 5000"},
		{"GET", "/api/agents/a/inbox/fetch?after=-1", "", 400, subjects.CodeInvalidRequest, "after must be a whole number"},
		{"GET", "/api/agents/bad.id/inbox/fetch", "", 400, subjects.CodeInvalidID, "agent_id"},
		{"POST", "/api/agents/a/inbox/ack", ``, 400, subjects.CodeInvalidRequest, "seq is required"},
		{"POST", "/api/agents/a/inbox/ack", `{}`, 400, subjects.CodeInvalidRequest, "seq is required"},
		{"POST", "/api/agents/a/inbox/ack", `{"seq":0}`, 400, subjects.CodeInvalidRequest, "seq must be a whole number from 1"},
		{"POST", "/api/agents/a/inbox/ack", `{"seq":"5"}`, 400, subjects.CodeInvalidRequest, "seq must be a whole number"},
		{"POST", "/api/agents/a/inbox/ack", `{"seq":1,"more":2}`, 400, subjects.CodeInvalidRequest, "more"},
		{"POST", "/api/agents/a/inbox/ack", `[1]`, 400, subjects.CodeInvalidJSON, ""},
		{"POST", "/api/agents/a/inbox/ack", `{"seq":99999}`, 400, subjects.CodeInvalidRequest, "seq 99999 is beyond the inbox's last delivery 0"},
		{"POST", "/api/agents/a/inbox/ack", `{"seq":1}` + strings.Repeat(" ", 64<<10), 413, subjects.CodePayloadTooLarge, "request body larger than 64 KiB"},
		{"DELETE", "/api/agents/a/inbox/ack", ``, 404, "not_found", "no route for DELETE /api/agents/a/inbox/ack"},
	} {
		status, body := send(t, tc.method, base+tc.path, []byte(tc.body), "Content-Type", "application/json")
		var e struct{ Error subjects.Error }
		if status != tc.status || json.Unmarshal(body, &e) != nil || e.Error.Code != tc.code || !strings.Contains(e.Error.Message, tc.msg) {
			t.Errorf("%s %s %.40s: %d %s, want %d %s containing %q", tc.method, tc.path, tc.body, status, body, tc.status, tc.code, tc.msg)
		}
	}
	if status, body := get(t, base+"/api/agents/a/inbox/fetch"); status != 200 || !strings.Contains(string(body), `"acked":0`) {
		t.Fatalf("after the refusals: %d %s", status, body)
	}
}

// TestInboxEventsFromTheCursor: the live feed starts after the agent's
// cursor (what it has not acked) unless told where; an agent may follow
// its own; one resuming with Last-Event-ID gets the rest once, and the
// feed holds no JetStream consumer.
func TestInboxEventsFromTheCursor(t *testing.T) {
	r, nc := startChime(t)
	base := "http://" + r.HTTPAddr()
	deliveriesFor(t, nc, "sse", 4)
	c, _ := client.New(nc, "sse")
	all, err := c.FetchInbox(context.Background(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.AckInbox(context.Background(), all.Deliveries[0].Seq); err != nil {
		t.Fatal(err)
	}
	seqs := func(events <-chan sseEvent, n int) []uint64 {
		t.Helper()
		var out []uint64
		for range n {
			ev := nextSSE(t, events)
			var d deliveries.InboxDelivery
			if ev.event != "delivery" || json.Unmarshal([]byte(ev.data), &d) != nil || d.Seq != ev.id {
				t.Fatalf("event %+v", ev)
			}
			out = append(out, d.Seq)
		}
		return out
	}
	want := func(ds []deliveries.InboxDelivery) []uint64 {
		var out []uint64
		for _, d := range ds {
			out = append(out, d.Seq)
		}
		return out
	}
	fromCursor := follow(t, base, "/api/agents/sse/inbox/events")
	if got := seqs(fromCursor, 3); fmt.Sprint(got) != fmt.Sprint(want(all.Deliveries[1:])) {
		t.Fatalf("from the cursor: %v, want %v", got, want(all.Deliveries[1:]))
	}
	resumed := follow(t, base, "/api/agents/sse/inbox/events", "Last-Event-ID", jsonNum(all.Deliveries[2].Seq))
	if got := seqs(resumed, 1); got[0] != all.Deliveries[3].Seq {
		t.Fatalf("resumed: %v", got)
	}
	if _, err := c.CreateTimer(context.Background(), 1, 0, "live"); err != nil {
		t.Fatal(err)
	}
	a, b := seqs(fromCursor, 1), seqs(resumed, 1)
	if a[0] != b[0] || a[0] <= all.Deliveries[3].Seq {
		t.Fatalf("the live one: %v and %v", a, b)
	}
	js, _ := jetstream.New(nc)
	st, err := js.Stream(context.Background(), "CHIME_INBOX")
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(context.Background()); err != nil || info.State.Consumers != 1 { // chime's own chime-waitfor-wakes
		t.Fatalf("consumers with two feeds open: %+v %v", info.State.Consumers, err)
	}
}
