package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waits"
)

// postJSON posts body to the replica's HTTP gateway.
func postJSON(t *testing.T, base, path, body string) (int, []byte) {
	t.Helper()
	res, err := http.Post(base+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// timerCount is how many timers the agent has.
func timerCount(t *testing.T, nc *nats.Conn, agent string) int {
	t.Helper()
	c, _ := client.New(nc, agent)
	list, err := c.ListTimers(context.Background(), subjects.MaxListLimit)
	if err != nil {
		t.Fatal(err)
	}
	return len(list)
}

// TestTimerCreateRequestID over NATS: a retry with the request_id gets the
// very reply of the first create and makes nothing; the same request in
// another form (key order, spacing, an explicit null) is a retry too;
// other fields under the same request_id are a conflict; creates without
// one are not deduplicated; another agent's request_id is its own.
func TestTimerCreateRequestID(t *testing.T) {
	_, nc := startChime(t)
	first := request(t, nc, "agent.idem.timer.create", `{"duration_ms":60000,"summary":"s","request_id":"r-1"}`)
	var tm timers.Timer
	if err := json.Unmarshal(first.Data, &tm); err != nil || tm.RequestID != "r-1" || tm.RequestHash == "" || !strings.HasPrefix(tm.ID, "tmr_") || len(tm.ID) != 26 {
		t.Fatalf("first create: %s", first.Data)
	}
	for _, retry := range []string{
		`{"duration_ms":60000,"summary":"s","request_id":"r-1"}`,
		`{ "request_id":"r-1", "summary":"s", "interval_ms":null, "duration_ms":60000 }`,
	} {
		again := request(t, nc, "agent.idem.timer.create", retry)
		if !bytes.Equal(again.Data, first.Data) || again.Header.Get("Nats-Service-Error") != "" {
			t.Fatalf("retry %s:\n got %s\nwant %s", retry, again.Data, first.Data)
		}
	}
	for _, other := range []string{
		`{"duration_ms":60001,"summary":"s","request_id":"r-1"}`,
		`{"duration_ms":60000,"summary":"t","request_id":"r-1"}`,
		`{"duration_ms":60000,"interval_ms":1000,"summary":"s","request_id":"r-1"}`,
	} {
		msg := request(t, nc, "agent.idem.timer.create", other)
		assertError(t, other, msg.Data, "conflict", `request_id "r-1" was used for a different request`)
		if msg.Header.Get("Nats-Service-Error-Code") != "409" {
			t.Errorf("%s: micro error code %q", other, msg.Header.Get("Nats-Service-Error-Code"))
		}
	}
	if n := timerCount(t, nc, "idem"); n != 1 {
		t.Fatalf("%d timers after one create and its retries", n)
	}
	var other timers.Timer
	if err := json.Unmarshal(request(t, nc, "agent.idem2.timer.create", `{"duration_ms":60000,"summary":"s","request_id":"r-1"}`).Data, &other); err != nil || other.ID == tm.ID {
		t.Fatalf("another agent's request_id r-1: %+v", other)
	}
	for range 2 {
		request(t, nc, "agent.plain.timer.create", `{"duration_ms":60000}`)
	}
	if n := timerCount(t, nc, "plain"); n != 2 {
		t.Fatalf("two creates without request_id made %d timers", n)
	}
	// The client's option; a retry after the timer fired returns it as it is now.
	c, _ := client.New(nc, "idem")
	ctx := context.Background()
	fired, err := c.CreateTimer(ctx, 50, 0, "", client.WithRequestID("fires"))
	if err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 5*time.Second, func() bool {
		got, err := c.GetTimer(ctx, fired.ID)
		return err == nil && got.Status == timers.TimerCompleted
	})
	again, err := c.CreateTimer(ctx, 50, 0, "", client.WithRequestID("fires"))
	if err != nil || again.ID != fired.ID || again.Status != timers.TimerCompleted || again.FireCount != 1 {
		t.Fatalf("retry after the fire: %+v %v", again, err)
	}
	if _, err := c.CreateTimer(ctx, 51, 0, "", client.WithRequestID("fires")); !errors.Is(err, subjects.ErrConflict) {
		t.Fatalf("conflict through the client: %v", err)
	}
}

// TestRequestIDRules: bad request_ids are refused with their own texts,
// over NATS for both creates.
func TestRequestIDRules(t *testing.T) {
	_, nc := startChime(t)
	for _, tc := range []struct{ subject, body, msg string }{
		{"timer.create", `{"duration_ms":1000,"request_id":""}`, "request_id must not be empty"},
		{"timer.create", `{"duration_ms":1000,"request_id":"` + strings.Repeat("é", 129) + `"}`, "request_id must be at most 128 characters"},
		{"timer.create", `{"duration_ms":1000,"request_id":"a\u0007b"}`, "request_id must be printable: character 2 is U+0007"},
		{"timer.create", `{"duration_ms":1000,"request_id":"tab\there"}`, "request_id must be printable: character 4 is U+0009"},
		{"wait.request", `{"seconds":10,"request_id":""}`, "request_id must not be empty"},
		{"wait.request", `{"seconds":10,"request_id":"x\ny"}`, "request_id must be printable: character 2 is U+000A"},
		{"wait.request", `{"seconds":10,"id":"mine","request_id":"r"}`, "use either id or request_id, not both"},
	} {
		assertError(t, tc.body, request(t, nc, "agent.rules."+tc.subject, tc.body).Data, "invalid_request", tc.msg)
	}
	assertError(t, "number", request(t, nc, "agent.rules.timer.create", `{"duration_ms":1000,"request_id":7}`).Data,
		"invalid_request", "request_id must be a JSON string, not number")
	for _, id := range []string{strings.Repeat("é", 128), "order #7: «ünïcode» ok"} {
		var tm timers.Timer
		if msg := request(t, nc, "agent.rules.timer.create", `{"duration_ms":60000,"request_id":"`+id+`"}`); json.Unmarshal(msg.Data, &tm) != nil || tm.RequestID != id {
			t.Fatalf("request_id %q refused: %s", id, msg.Data)
		}
	}
}

// TestWaitRequestID: a wait.request retried with its request_id returns
// the first reply and makes no second wait, even a while later (the same
// duration is the same request, not the same target); another duration
// under it is a conflict.
func TestWaitRequestID(t *testing.T) {
	_, nc := startChime(t)
	first := request(t, nc, "agent.w.wait.request", `{"seconds":60,"request_id":"w-1"}`)
	var reply waits.WaitReply
	if err := json.Unmarshal(first.Data, &reply); err != nil || !strings.HasPrefix(reply.WaitID, "wait_") || len(reply.WaitID) != 27 {
		t.Fatalf("first: %s", first.Data)
	}
	time.Sleep(20 * time.Millisecond)
	for _, retry := range []string{`{"seconds":60,"request_id":"w-1"}`, `{"minutes":1,"request_id":"w-1"}`} {
		if again := request(t, nc, "agent.w.wait.request", retry); !bytes.Equal(again.Data, first.Data) {
			t.Fatalf("retry %s:\n got %s\nwant %s", retry, again.Data, first.Data)
		}
	}
	for _, other := range []string{`{"seconds":61,"request_id":"w-1"}`, `{"seconds":60,"tz":"Europe/Berlin","request_id":"w-1"}`} {
		assertError(t, other, request(t, nc, "agent.w.wait.request", other).Data, "conflict", `request_id "w-1" was used for a different request`)
	}
	until := `{"until":"2099-01-01T09:00:00Z","request_id":"u"}`
	u1, u2 := request(t, nc, "agent.w.wait.request", until), request(t, nc, "agent.w.wait.request", `{"until":"2099-01-01 10:00:00+01:00","request_id":"u"}`)
	if !bytes.Equal(u1.Data, u2.Data) || bytes.Contains(u1.Data, []byte(`"error"`)) {
		t.Fatalf("the same until instant: %s then %s", u1.Data, u2.Data)
	}
	// Cancelled, the wait is still the request's: the retry says so.
	c, _ := client.New(nc, "w")
	if _, err := c.CancelWait(context.Background(), reply.WaitID); err != nil {
		t.Fatal(err)
	}
	if again := request(t, nc, "agent.w.wait.request", `{"seconds":60,"request_id":"w-1"}`); !bytes.Equal(again.Data, first.Data) {
		t.Fatalf("retry after cancel: %s", again.Data)
	}
}

// TestConcurrentCreatesWithOneRequestID: ten creates with the same
// request_id at once, over NATS (queue group) and HTTP, make one timer
// (and ten waits one wait), and every caller gets it.
func TestConcurrentCreatesWithOneRequestID(t *testing.T) {
	r, nc := startChime(t)
	base := "http://" + r.HTTPAddr()
	ids := make(chan string, 20)
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			var tm timers.Timer
			var body []byte
			if i%2 == 0 {
				m, err := nc.Request("agent.race.timer.create", []byte(`{"duration_ms":60000,"request_id":"once"}`), 5*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				body = m.Data
			} else {
				status, b := postJSON(t, base, "/api/control/agents/race/timers", `{"duration_ms":60000,"request_id":"once"}`)
				if status != http.StatusCreated {
					t.Errorf("http create: %d %s", status, b)
				}
				body = b
			}
			if err := json.Unmarshal(body, &tm); err != nil || tm.ID == "" {
				t.Errorf("create: %s", body)
			}
			ids <- tm.ID
		})
		wg.Go(func() {
			var w waits.WaitReply
			m, err := nc.Request("agent.race.wait.request", []byte(`{"seconds":60,"request_id":"once"}`), 5*time.Second)
			if err != nil || json.Unmarshal(m.Data, &w) != nil || w.WaitID == "" {
				t.Errorf("wait request: %v %v", err, m)
				return
			}
			ids <- w.WaitID
		})
	}
	wg.Wait()
	close(ids)
	seen := map[string]int{}
	for id := range ids {
		seen[id]++
	}
	if len(seen) != 2 {
		t.Fatalf("ten creates and ten waits with one request_id gave %v", seen)
	}
	if n := timerCount(t, nc, "race"); n != 1 {
		t.Fatalf("%d timers", n)
	}
}

// TestHTTPTimerCreateRequestID: the HTTP route answers a retry as it
// answered the first create (201, the same body) and a conflict with 409.
func TestHTTPTimerCreateRequestID(t *testing.T) {
	r, nc := startChime(t)
	base := "http://" + r.HTTPAddr()
	body := `{"duration_ms":60000,"summary":"web","request_id":"h-1"}`
	s1, b1 := postJSON(t, base, "/api/control/agents/web/timers", body)
	s2, b2 := postJSON(t, base, "/api/control/agents/web/timers", body)
	if s1 != http.StatusCreated || s2 != http.StatusCreated || !bytes.Equal(b1, b2) {
		t.Fatalf("create %d %s, retry %d %s", s1, b1, s2, b2)
	}
	s3, b3 := postJSON(t, base, "/api/control/agents/web/timers", `{"duration_ms":60000,"summary":"other","request_id":"h-1"}`)
	if s3 != http.StatusConflict {
		t.Fatalf("conflict status %d", s3)
	}
	assertError(t, "http conflict", b3, "conflict", `request_id "h-1" was used for a different request`)
	// The retry over NATS finds the timer HTTP made: one store, one key.
	if m := request(t, nc, "agent.web.timer.create", body); !bytes.Equal(m.Data, b1) {
		t.Fatalf("NATS retry of an HTTP create: %s", m.Data)
	}
	if n := timerCount(t, nc, "web"); n != 1 {
		t.Fatalf("%d timers", n)
	}
}

// TestRequestIDAcrossReplicasAndRestart: a retry answered by another
// replica, or by a replica started again on the same store, returns the
// timer the first create made.
func TestRequestIDAcrossReplicasAndRestart(t *testing.T) {
	dir := t.TempDir()
	a, _ := startChimeWith(t, io.Discard, func(c *config.Config) { c.DataDir, c.ReplicaID = dir, "a" })
	b, _ := startChimeWith(t, io.Discard, func(c *config.Config) { c.NATSURL, c.ReplicaID = a.NATSURL(), "b" })
	body := `{"duration_ms":600000,"request_id":"x-1"}`
	s1, first := postJSON(t, "http://"+a.HTTPAddr(), "/api/control/agents/multi/timers", body)
	s2, again := postJSON(t, "http://"+b.HTTPAddr(), "/api/control/agents/multi/timers", body)
	if s1 != http.StatusCreated || s2 != http.StatusCreated || !bytes.Equal(first, again) {
		t.Fatalf("on a: %d %s; on b: %d %s", s1, first, s2, again)
	}
	b.Stop(context.Background())
	a.Stop(context.Background())
	c, nc := startChimeWith(t, io.Discard, func(c *config.Config) { c.DataDir, c.ReplicaID = dir, "a" })
	if s, after := postJSON(t, "http://"+c.HTTPAddr(), "/api/control/agents/multi/timers", body); s != http.StatusCreated || !bytes.Equal(after, first) {
		t.Fatalf("after a restart: %d %s", s, after)
	}
	if n := timerCount(t, nc, "multi"); n != 1 {
		t.Fatalf("%d timers", n)
	}
}
