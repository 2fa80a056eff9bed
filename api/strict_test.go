package api_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/api"
	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/subjects"
)

// strictInputs are bodies the strict decoder refuses; the same table runs
// over NATS and HTTP against timer create.
var strictInputs = []struct {
	name, body, code, msg string
}{
	{"case-variant key beside the real one", `{"duration_ms":3600000,"Duration_MS":5}`, "invalid_request", `unknown field "Duration_MS"`},
	{"case-variant key alone", `{"DURATION_MS":5}`, "invalid_request", `unknown field "DURATION_MS"`},
	{"duplicate key", `{"duration_ms":3600000,"duration_ms":5}`, "invalid_json", `duplicate key "duration_ms"`},
	{"nested duplicate", `{"duration_ms":5,"interval_ms":{"a":1,"a":2}}`, "invalid_json", `duplicate key "a" in interval_ms`},
	{"invalid UTF-8 in a value", "{\"duration_ms\":5,\"summary\":\"caf\xe9\"}", "invalid_json", "invalid UTF-8: byte 0xe9 at offset 31"},
	{"invalid UTF-8 in a key", "{\"duration_ms\":5,\"summ\xffary\":\"x\"}", "invalid_json", "invalid UTF-8: byte 0xff at offset 22"},
	{"lone surrogate", `{"duration_ms":5,"summary":"\udc00"}`, "invalid_json", `invalid UTF-8: lone surrogate \udc00 at offset 28`},
	{"trailing data", `{"duration_ms":5} {"duration_ms":6}`, "invalid_json", "malformed JSON: unexpected data after the object"},
	{"not an object", `[{"duration_ms":5}]`, "invalid_json", "request body must be a JSON object"},
}

// storedKeys counts the agent's records in a KV bucket.
func storedKeys(t *testing.T, nc *nats.Conn, bucket, agent string) int {
	t.Helper()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	lister, err := kv.ListKeysFiltered(ctx, agent+".>")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range lister.Keys() {
		n++
	}
	return n
}

// TestStrictInput runs the strict table over NATS and HTTP, then a
// duplicate-key wait and callback: each is refused and nothing is stored.
func TestStrictInput(t *testing.T) {
	r, nc := startChime(t)
	base := "http://" + r.HTTPAddr()
	for _, in := range strictInputs {
		msg := request(t, nc, "agent.strict.timer.create", in.body)
		assertError(t, "NATS "+in.name, msg.Data, in.code, in.msg)
		if msg.Header.Get("Nats-Service-Error-Code") != "400" {
			t.Errorf("NATS %s: micro error headers %v", in.name, msg.Header)
		}
		status, body := post(t, base+"/api/control/agents/strict/timers", "application/json", []byte(in.body))
		if status != 400 {
			t.Errorf("HTTP %s: status %d", in.name, status)
		}
		assertError(t, "HTTP "+in.name, body, in.code, in.msg)
	}
	if n := storedKeys(t, nc, engine.TimersBucket, "strict"); n != 0 {
		t.Errorf("%d timers stored from refused bodies", n)
	}

	msg := request(t, nc, "agent.strict.wait.request", `{"seconds":3600,"seconds":1}`)
	assertError(t, "wait", msg.Data, "invalid_json", `duplicate key "seconds"`)
	msg = request(t, nc, "agent.strict.wait.request", `{"Seconds":1}`)
	assertError(t, "wait", msg.Data, "invalid_request", `unknown field "Seconds"`)
	if n := storedKeys(t, nc, engine.WaitsBucket, "strict"); n != 0 {
		t.Errorf("%d waits stored from refused bodies", n)
	}

	urls := startAgent(t, nc, "strict")
	before := eventCount(t, nc)
	status, body := post(t, urls[callbacks.ModeEnqueueMessage], "application/json", []byte(`{"text":"benign","text":"evil"}`))
	if status != 400 {
		t.Errorf("callback with a duplicate key: status %d", status)
	}
	assertError(t, "callback", body, "invalid_json", `malformed JSON body: duplicate key "text"`)
	status, body = post(t, urls[callbacks.ModeEnqueueMessage], "application/json", []byte("{\"text\":\"\xff\"}"))
	if status != 400 {
		t.Errorf("callback with invalid UTF-8: status %d", status)
	}
	assertError(t, "callback", body, "invalid_json", "malformed JSON body: invalid UTF-8: byte 0xff at offset 9")
	if got := eventCount(t, nc); got != before {
		t.Errorf("refused callbacks stored: %d events, want %d", got, before)
	}
}

// TestBodyLimits: every route refuses a body one byte over its limit with
// 413 payload_too_large, and takes one at the limit; over NATS the same
// limits give the same error.
func TestBodyLimits(t *testing.T) {
	r, nc := startChime(t)
	base := "http://" + r.HTTPAddr()
	urls := startAgent(t, nc, "big")
	const requestTooLarge, callbackTooLarge = "request body larger than 64 KiB", "callback body larger than 256 KiB"
	for _, rt := range []struct {
		method, path string
		limit        int
		msg          string
	}{
		// Callbacks first: the start and stop rows revoke these URLs.
		{"POST", strings.TrimPrefix(urls[callbacks.ModeWakeHint], base), callbacks.MaxCallbackBody, callbackTooLarge},
		{"POST", strings.TrimPrefix(urls[callbacks.ModeEnqueueMessage], base), callbacks.MaxCallbackBody, callbackTooLarge},
		{"POST", "/api/control/agents/big/timers", subjects.MaxRequestBody, requestTooLarge},
		{"POST", "/api/control/agents/big/timers/tmr_x/cancel", subjects.MaxRequestBody, requestTooLarge},
		{"POST", "/api/control/agents/big/start", subjects.MaxRequestBody, requestTooLarge},
		{"POST", "/api/control/agents/big/stop", subjects.MaxRequestBody, requestTooLarge},
		{"POST", "/api/control/agents/big/reset-callback", subjects.MaxRequestBody, requestTooLarge},
		{"POST", "/api/control/agents/big/triggers", subjects.MaxRequestBody, requestTooLarge},
		{"POST", "/api/control/agents/big/triggers/trg_x/cancel", subjects.MaxRequestBody, requestTooLarge},
		{"GET", "/api/agents/big/timers", subjects.MaxRequestBody, requestTooLarge},
		{"GET", "/api/agents/big/timers/tmr_x", subjects.MaxRequestBody, requestTooLarge},
		{"GET", "/api/agents/big/triggers", subjects.MaxRequestBody, requestTooLarge},
	} {
		// Spaces around {}: a body that decodes wherever one is read.
		for _, size := range []int{rt.limit + 1, rt.limit} {
			body := append(bytes.Repeat([]byte(" "), size-2), "{}"...)
			req, _ := http.NewRequest(rt.method, base+rt.path, bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", rt.method, rt.path, err)
			}
			got, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if size > rt.limit {
				if res.StatusCode != http.StatusRequestEntityTooLarge {
					t.Errorf("%s %s, %d bytes: status %d, want 413", rt.method, rt.path, size, res.StatusCode)
				}
				assertError(t, rt.path, got, "payload_too_large", rt.msg)
			} else if res.StatusCode == http.StatusRequestEntityTooLarge {
				t.Errorf("%s %s: %d bytes, at the limit, refused: %s", rt.method, rt.path, size, got)
			}
		}
	}

	// NATS: the same limits, the same error.
	over := append(bytes.Repeat([]byte(" "), subjects.MaxRequestBody-1), "{}"...)
	msg := request(t, nc, "agent.big.timer.create", string(over))
	assertError(t, "NATS timer.create", msg.Data, "payload_too_large", requestTooLarge)
	if msg.Header.Get("Nats-Service-Error-Code") != "413" {
		t.Errorf("NATS timer.create: micro error headers %v", msg.Header)
	}
	cb := nats.NewMsg(subjects.CallbackEnqueue)
	cb.Header.Set(subjects.HeaderCallbackToken, "chime_cb_nope")
	cb.Data = bytes.Repeat([]byte("a"), callbacks.MaxCallbackBody+1)
	reply, err := nc.RequestMsg(cb, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	assertError(t, "NATS callback", reply.Data, "payload_too_large", callbackTooLarge)
	// An intervention has no limit of its own: its text is bounded by what
	// its deliveries can carry.
	long := `{"action":"message","text":"` + strings.Repeat("x", 100<<10) + `"}`
	if reply := request(t, nc, "agent.big.intervention", long); !bytes.Contains(reply.Data, []byte(`"ok":true`)) {
		t.Errorf("a 100 KiB intervention: %s", reply.Data)
	}
	// Over HTTP no server's max payload bounds it: a body larger than any
	// text a delivery could carry (six body bytes to one, escaped) is
	// refused before it is read whole; one within that bound but too long
	// to deliver gets the intervention's own answer.
	room := nc.MaxPayload()
	for _, c := range []struct {
		size int64
		msg  string
	}{
		{7*room + subjects.MaxRequestBody, "request body larger than"},
		{2 * room, "intervention text too large"},
	} {
		body := `{"action":"message","text":"` + strings.Repeat("x", int(c.size)) + `"}`
		res, err := http.Post(base+"/api/control/agents/big/intervention", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusRequestEntityTooLarge || !bytes.Contains(got, []byte(c.msg)) {
			t.Errorf("HTTP intervention of %d bytes: %d %s", c.size, res.StatusCode, got)
		}
	}
	if n := storedKeys(t, nc, engine.TimersBucket, "big"); n != 0 {
		t.Errorf("%d timers stored from refused bodies", n)
	}
}

// TestSlowHeadersCutOff: a client that sends its headers a byte at a time
// (slowloris) is disconnected once the header timeout passes, although
// every byte arrives well within it; the gateway goes on serving others.
func TestSlowHeadersCutOff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ops := api.NewOperations(api.Config{})
	h := api.NewHandler(ops, prometheus.NewRegistry(), func() (bool, string) { return true, "" }, access.Resolver{})
	g := api.NewGateway(ln, h, slog.New(slog.DiscardHandler), api.Timeouts{ReadHeader: 300 * time.Millisecond})
	_ = g.Start(context.Background())
	t.Cleanup(func() { _ = g.Stop(context.Background()) })

	conn, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stop := make(chan struct{})
	sent := make(chan int, 1)
	head := []byte("GET /healthz HTTP/1.1\r\nHost: chime\r\nX-Slow: " + strings.Repeat("a", 1000) + "\r\n\r\n")
	go func() {
		n := 0
		defer func() { sent <- n }()
		for _, b := range head {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := conn.Write([]byte{b}); err != nil {
				return
			}
			n++
		}
	}()
	// The guard only ends a broken test: the cut comes long before it.
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	got, err := io.ReadAll(conn)
	close(stop)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the slow client was not disconnected (%d bytes sent)", <-sent)
	}
	// net/http may say 400 as it hangs up; never does the request run.
	if len(got) != 0 && !bytes.HasPrefix(got, []byte("HTTP/1.1 400 ")) {
		t.Fatalf("the slow client got a reply: %q", got)
	}
	if n := <-sent; n == len(head) {
		t.Fatalf("the whole header went through (%d bytes) before the cut", n)
	}

	res, err := http.Get("http://" + g.Addr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("healthz after the cut: %d", res.StatusCode)
	}
}
