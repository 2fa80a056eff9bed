package api_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/deliveries"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/testlog"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/subjects"
)

// startAgent starts agent over NATS and returns its trigger URLs by mode.
func startAgent(t *testing.T, nc *nats.Conn, agent string) map[callbacks.DeliveryMode]string {
	t.Helper()
	var reply callbacks.LifecycleReply
	if err := subjects.DecodeReply(request(t, nc, "agent."+agent+".lifecycle.start", "").Data, &reply); err != nil {
		t.Fatal(err)
	}
	if reply.Status != agents.AgentActive || len(reply.Triggers) != 2 {
		t.Fatalf("start: %+v", reply)
	}
	urls := map[callbacks.DeliveryMode]string{}
	for _, tr := range reply.Triggers {
		if !tr.Default || tr.Status != callbacks.TriggerActive || tr.TriggerURL == "" {
			t.Fatalf("start: trigger %+v", tr)
		}
		urls[tr.Mode] = tr.TriggerURL
	}
	return urls
}

// post sends a callback and returns the status and body.
func post(t *testing.T, url, contentType string, body []byte, header ...string) (int, []byte) {
	t.Helper()
	if contentType != "" {
		header = append(header, "Content-Type", contentType)
	}
	return send(t, "POST", url, body, header...)
}

// newRequest makes a request with headers (name, value, ...).
func newRequest(t *testing.T, ctx context.Context, method, url string, body []byte, header ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return req
}

// send makes a request with headers (name, value, ...) and returns the
// status and body.
func send(t *testing.T, method, url string, body []byte, header ...string) (int, []byte) {
	t.Helper()
	res, err := http.DefaultClient.Do(newRequest(t, context.Background(), method, url, body, header...))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

func accepted(t *testing.T, status int, body []byte, agent string, mode callbacks.DeliveryMode, disposition string) callbacks.CallbackResult {
	t.Helper()
	var reply callbacks.CallbackReply
	if status != 200 || json.Unmarshal(body, &reply) != nil || !reply.OK || reply.Result.AgentID != agent ||
		reply.Result.Mode != mode || reply.Result.Disposition != disposition || reply.Result.TriggerID == "" {
		t.Fatalf("callback: %d %s, want %s %s", status, body, mode, disposition)
	}
	return reply.Result
}

const rejected = `{"error":{"code":"forbidden","message":"callback rejected"}}`

func assertRejected(t *testing.T, what string, status int, body []byte) {
	t.Helper()
	if status != 403 || string(body) != rejected {
		t.Errorf("%s: %d %s, want 403 %s", what, status, body, rejected)
	}
}

// inboxOf collects the agent's inbox deliveries as they are published.
func inboxOf(t *testing.T, nc *nats.Conn, agent string) <-chan subjects.Envelope {
	t.Helper()
	ch := make(chan subjects.Envelope, 64)
	sub, err := nc.Subscribe(subjects.Inbox(agent), func(m *nats.Msg) {
		var env subjects.Envelope
		if json.Unmarshal(m.Data, &env) == nil {
			ch <- env
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return ch
}

func next(t *testing.T, ch <-chan subjects.Envelope) subjects.Envelope {
	t.Helper()
	select {
	case env := <-ch:
		return env
	case <-time.After(5 * time.Second):
		t.Fatal("no inbox delivery within 5s")
		return subjects.Envelope{}
	}
}

// eventCount is how many callbacks the events stream holds.
func eventCount(t *testing.T, nc *nats.Conn) uint64 {
	t.Helper()
	js, _ := jetstream.New(nc)
	s, err := js.Stream(context.Background(), engine.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background(), jetstream.WithSubjectFilter("callback.event.>"))
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}

func TestCallbackDeliveries(t *testing.T) {
	_, nc := startChime(t)
	urls := startAgent(t, nc, "ci")
	inbox := inboxOf(t, nc, "ci")
	wake, enqueue := urls[callbacks.ModeWakeHint], urls[callbacks.ModeEnqueueMessage]
	if !strings.Contains(wake, "/api/callbacks/wake/chime_cb_") || !strings.Contains(enqueue, "/api/callbacks/enqueue/chime_cb_") {
		t.Fatalf("urls %v", urls)
	}

	// An empty POST wakes.
	status, body := post(t, wake, "", nil)
	res := accepted(t, status, body, "ci", callbacks.ModeWakeHint, callbacks.DispositionTriggered)
	env := next(t, inbox)
	if env.Kind != subjects.KindWakeHint || env.Trust != subjects.TrustExternal || env.Text != "external trigger fired" ||
		env.Source.ID != res.TriggerID || env.Source.Type != "external_trigger" {
		t.Errorf("wake hint %+v", env)
	}

	for _, tc := range []struct {
		contentType, body, text string
	}{
		{"text/plain; charset=utf-8", "deploy 42 finished", "deploy 42 finished"},
		{"application/json", `{"text": "tests passed"}`, "tests passed"},
		{"application/vnd.github+json", `{"action": "completed"}`, `{"action":"completed"}`},
		{"application/octet-stream", "\x00\x01binary", ""},
	} {
		status, body := post(t, enqueue, tc.contentType, []byte(tc.body))
		accepted(t, status, body, "ci", callbacks.ModeEnqueueMessage, callbacks.DispositionEnqueued)
		env := next(t, inbox)
		if env.Kind != subjects.KindMessage || env.Trust != subjects.TrustExternal || env.Text != tc.text {
			t.Errorf("%s: message %+v", tc.contentType, env)
		}
		if tc.contentType == "application/octet-stream" {
			var data callbacks.CallbackData
			_ = json.Unmarshal(env.Data, &data)
			if data.Payload == nil || data.Payload.ContentType != "application/octet-stream" || data.Payload.BodyBase64 != "AAFiaW5hcnk=" {
				t.Errorf("binary payload %s", env.Data)
			}
		}
	}

	// A wake's reason is the JSON cut to 160 characters.
	long := `{"log":"` + strings.Repeat("x", 300) + `"}`
	// Wake hints are held back only for agents with an inbox consumer; this
	// agent has none, so each wake is delivered.
	status, body = post(t, wake, "application/json", []byte(long))
	accepted(t, status, body, "ci", callbacks.ModeWakeHint, callbacks.DispositionTriggered)
	env = next(t, inbox)
	if env.Text != long[:160]+"..." {
		t.Errorf("reason %q", env.Text)
	}
}

func TestCallbackRules(t *testing.T) {
	r, nc := startChime(t)
	urls := startAgent(t, nc, "rules")
	wake, enqueue := urls[callbacks.ModeWakeHint], urls[callbacks.ModeEnqueueMessage]
	base := "http://" + r.HTTPAddr()
	before := eventCount(t, nc)

	status, body := post(t, enqueue, "application/json", []byte(`{"text":`))
	if status != 400 || !strings.Contains(string(body), `"code":"invalid_json"`) {
		t.Errorf("malformed JSON: %d %s", status, body)
	}
	status, body = post(t, enqueue, "text/plain", bytes.Repeat([]byte("a"), callbacks.MaxCallbackBody+1))
	if status != 413 || !strings.Contains(string(body), `"code":"payload_too_large"`) {
		t.Errorf("256 KiB + 1: %d %s", status, body)
	}
	rejectedAt(t, "wake token on the enqueue route", strings.Replace(wake, "/wake/", "/enqueue/", 1))
	rejectedAt(t, "enqueue token on the wake route", strings.Replace(enqueue, "/enqueue/", "/wake/", 1))
	rejectedAt(t, "unknown token", base+"/api/callbacks/wake/chime_cb_nope")
	if got := eventCount(t, nc); got != before {
		t.Fatalf("rejected callbacks stored: %d events, want %d", got, before)
	}
	status, body = post(t, enqueue, "text/plain", bytes.Repeat([]byte("a"), callbacks.MaxCallbackBody))
	accepted(t, status, body, "rules", callbacks.ModeEnqueueMessage, callbacks.DispositionEnqueued)
	if got := eventCount(t, nc); got != before+1 {
		t.Fatalf("256 KiB: %d events, want %d", got, before+1)
	}

	// Reset: the old URL is dead, the new one works.
	status, body = post(t, base+"/api/control/agents/rules/reset-callback", "application/json", []byte(`{"delivery_mode":"enqueue_message"}`))
	var reset callbacks.ResetReply
	if status != 200 || json.Unmarshal(body, &reset) != nil || !reset.OK || reset.AgentID != "rules" ||
		reset.Mode != callbacks.ModeEnqueueMessage || reset.Status != callbacks.TriggerActive || reset.TriggerURL == enqueue {
		t.Fatalf("reset: %d %s", status, body)
	}
	rejectedAt(t, "enqueue URL after reset", enqueue)
	status, body = post(t, reset.TriggerURL, "text/plain", []byte("after reset"))
	accepted(t, status, body, "rules", callbacks.ModeEnqueueMessage, callbacks.DispositionEnqueued)

	// Extra triggers: create, list, cancel (twice), unknown.
	status, body = post(t, base+"/api/control/agents/rules/triggers", "application/json", []byte(`{"delivery_mode":"wake_hint","label":"github"}`))
	var extra callbacks.TriggerView
	if status != 201 || json.Unmarshal(body, &extra) != nil || extra.Label != "github" || extra.Default || extra.TriggerURL == "" {
		t.Fatalf("create trigger: %d %s", status, body)
	}
	for range 2 {
		status, body = post(t, base+"/api/control/agents/rules/triggers/"+extra.ID+"/cancel", "", nil)
		if status != 200 || !strings.Contains(string(body), `"status":"revoked"`) {
			t.Errorf("cancel trigger: %d %s", status, body)
		}
	}
	rejectedAt(t, "cancelled trigger", extra.TriggerURL)
	status, body = post(t, base+"/api/control/agents/rules/triggers/trg_nope/cancel", "", nil)
	if status != 404 || !strings.Contains(string(body), `"code":"trigger_not_found"`) {
		t.Errorf("cancel unknown: %d %s", status, body)
	}
	for _, bad := range []struct{ body, code string }{
		{`{"delivery_mode":"push"}`, "invalid_request"},
		{`{"delivery_mode":"wake_hint","colour":1}`, "invalid_request"},
		{`{"label":"` + strings.Repeat("l", 201) + `"}`, "invalid_request"},
		{`[`, "invalid_json"},
	} {
		status, body = post(t, base+"/api/control/agents/rules/triggers", "application/json", []byte(bad.body))
		if status != 400 || !strings.Contains(string(body), `"code":"`+bad.code+`"`) {
			t.Errorf("create trigger %s: %d %s", bad.body, status, body)
		}
	}
	res, err := http.Get(base + "/api/agents/rules/triggers")
	if err != nil {
		t.Fatal(err)
	}
	var list struct{ Triggers []callbacks.TriggerView }
	_ = json.NewDecoder(res.Body).Decode(&list)
	res.Body.Close()
	if len(list.Triggers) != 4 { // two defaults, the reset's, the extra
		t.Errorf("list: %+v", list)
	}

	// Stop revokes everything; a restart issues new URLs, the old stay dead.
	status, body = post(t, base+"/api/control/agents/rules/stop", "", nil)
	if status != 200 || strings.Contains(string(body), `"status":"active"`) {
		t.Fatalf("stop: %d %s", status, body)
	}
	rejectedAt(t, "stopped agent", reset.TriggerURL)
	status, body = post(t, base+"/api/control/agents/rules/reset-callback", "", nil)
	if status != 409 || !strings.Contains(string(body), `"code":"agent_not_active"`) {
		t.Errorf("reset of a stopped agent: %d %s", status, body)
	}
	again := startAgent(t, nc, "rules")
	rejectedAt(t, "old wake URL after restart", wake)
	rejectedAt(t, "old enqueue URL after restart", reset.TriggerURL)
	status, body = post(t, again[callbacks.ModeWakeHint], "", nil)
	accepted(t, status, body, "rules", callbacks.ModeWakeHint, callbacks.DispositionTriggered)

	// A start while active is a restart: every earlier URL dies, extra ones too.
	status, body = post(t, base+"/api/control/agents/rules/triggers", "application/json", []byte(`{"delivery_mode":"enqueue_message"}`))
	if status != 201 || json.Unmarshal(body, &extra) != nil {
		t.Fatalf("create trigger: %d %s", status, body)
	}
	startAgent(t, nc, "rules")
	rejectedAt(t, "extra URL after a restart", extra.TriggerURL)
	rejectedAt(t, "default URL after a restart", again[callbacks.ModeWakeHint])
}

// rejectedAt posts an empty callback to url and wants the generic 403.
func rejectedAt(t *testing.T, what, url string) {
	t.Helper()
	status, body := post(t, url, "", nil)
	assertRejected(t, what, status, body)
}

func TestCallbackCoalescing(t *testing.T) {
	_, nc := startChime(t)
	urls := startAgent(t, nc, "co")
	wake := urls[callbacks.ModeWakeHint]
	ctx := context.Background()
	js, _ := jetstream.New(nc)
	// The agent reads its inbox with its durable consumer and acks.
	cons, err := js.CreateOrUpdateConsumer(ctx, engine.InboxStream, jetstream.ConsumerConfig{
		Durable: agents.InboxConsumer("co"), FilterSubject: subjects.Inbox("co"), AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	status, body := post(t, wake, "text/plain", []byte("first"))
	accepted(t, status, body, "co", callbacks.ModeWakeHint, callbacks.DispositionTriggered)
	status, body = post(t, wake, "text/plain", []byte("second"))
	accepted(t, status, body, "co", callbacks.ModeWakeHint, callbacks.DispositionCoalesced)

	msgs, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []jetstream.Msg
	for m := range msgs.Messages() {
		got = append(got, m)
	}
	if len(got) != 1 {
		t.Fatalf("fetched %d", len(got))
	}
	var env subjects.Envelope
	_ = json.Unmarshal(got[0].Data(), &env)
	if env.Kind != subjects.KindWakeHint || env.Text != "first" {
		t.Fatalf("pending hint %+v", env)
	}
	// Read but not acked: still pending.
	status, body = post(t, wake, "text/plain", []byte("third"))
	accepted(t, status, body, "co", callbacks.ModeWakeHint, callbacks.DispositionCoalesced)
	if err := got[0].DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	status, body = post(t, wake, "text/plain", []byte("fourth"))
	accepted(t, status, body, "co", callbacks.ModeWakeHint, callbacks.DispositionTriggered)
	msgs, err = cons.Fetch(2, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	for m := range msgs.Messages() {
		_ = json.Unmarshal(m.Data(), &env)
		texts = append(texts, env.Text)
	}
	if strings.Join(texts, ",") != "fourth" {
		t.Errorf("after the ack the inbox holds %v, want only the fourth (second and third coalesced)", texts)
	}
}

func TestCallbackIdempotencyKey(t *testing.T) {
	_, nc := startChime(t)
	enqueue := startAgent(t, nc, "idem")[callbacks.ModeEnqueueMessage]
	inbox := inboxOf(t, nc, "idem")
	before := eventCount(t, nc)
	status, body := post(t, enqueue, "text/plain", []byte("once"), "Idempotency-Key", "delivery-7")
	accepted(t, status, body, "idem", callbacks.ModeEnqueueMessage, callbacks.DispositionEnqueued)
	status, body = post(t, enqueue, "text/plain", []byte("once"), "Idempotency-Key", "delivery-7")
	accepted(t, status, body, "idem", callbacks.ModeEnqueueMessage, callbacks.DispositionDuplicate)
	if env := next(t, inbox); env.Text != "once" {
		t.Fatalf("delivery %+v", env)
	}
	select {
	case env := <-inbox:
		t.Fatalf("retry delivered again: %+v", env)
	case <-time.After(500 * time.Millisecond):
	}
	if got := eventCount(t, nc); got != before+1 {
		t.Errorf("stored %d events, want 1", got-before)
	}
}

func TestCallbackOverNATS(t *testing.T) {
	_, nc := startChime(t)
	urls := startAgent(t, nc, "natsy")
	token := urls[callbacks.ModeEnqueueMessage][strings.LastIndex(urls[callbacks.ModeEnqueueMessage], "/")+1:]
	inbox := inboxOf(t, nc, "natsy")
	call := func(subject, token string, body string) *nats.Msg {
		m := nats.NewMsg(subject)
		m.Data = []byte(body)
		if token != "" {
			m.Header.Set(subjects.HeaderCallbackToken, token)
		}
		m.Header.Set("Content-Type", "text/plain")
		reply, err := nc.RequestMsg(m, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return reply
	}
	reply := call(subjects.CallbackEnqueue, token, "over nats")
	accepted(t, 200, reply.Data, "natsy", callbacks.ModeEnqueueMessage, callbacks.DispositionEnqueued)
	if env := next(t, inbox); env.Kind != subjects.KindMessage || env.Text != "over nats" || env.Trust != subjects.TrustExternal {
		t.Errorf("delivery %+v", env)
	}
	for _, tc := range []struct{ subject, token string }{
		{subjects.CallbackWake, token}, // the other mode
		{subjects.CallbackEnqueue, ""},
		{subjects.CallbackEnqueue, "chime_cb_guess"},
	} {
		reply := call(tc.subject, tc.token, "x")
		if string(reply.Data) != rejected || reply.Header.Get("Nats-Service-Error-Code") != "403" {
			t.Errorf("%s with a token %v: %s %v", tc.subject, tc.token != "", reply.Data, reply.Header)
		}
	}
}

func TestOperatorTokens(t *testing.T) {
	const token = "operator-secret-token"
	h := sha256.Sum256([]byte(token))
	file := filepath.Join(t.TempDir(), "operators")
	if err := os.WriteFile(file, []byte("# operators\n"+hex.EncodeToString(h[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, nc := startChimeWith(t, io.Discard, func(c *config.Config) { c.OperatorTokensFile = file })
	base := "http://" + r.HTTPAddr()
	urls := startAgent(t, nc, "guarded")
	for _, path := range []string{"/api/control/agents/guarded/reset-callback", "/api/control/agents/guarded/timers"} {
		for _, auth := range []string{"", "Bearer wrong", "Basic " + token, "Bearer "} {
			status, body := post(t, base+path, "application/json", []byte(`{"duration_ms":1000}`), "Authorization", auth)
			if status != 401 || !strings.Contains(string(body), `"code":"unauthorized"`) {
				t.Errorf("%s with %q: %d %s", path, auth, status, body)
			}
		}
	}
	res, err := http.Get(base + "/api/agents/guarded/triggers")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 401 {
		t.Errorf("agent-scoped read without a token: %d", res.StatusCode)
	}
	status, body := post(t, base+"/api/control/agents/guarded/reset-callback", "", nil, "Authorization", "Bearer "+token)
	if status != 200 {
		t.Errorf("with the token: %d %s", status, body)
	}
	// Callbacks carry their own capability; health stays open.
	status, body = post(t, urls[callbacks.ModeEnqueueMessage], "text/plain", []byte("hi"))
	accepted(t, status, body, "guarded", callbacks.ModeEnqueueMessage, callbacks.DispositionEnqueued)
	if res, err := http.Get(base + "/healthz"); err != nil || res.StatusCode != 200 {
		t.Errorf("healthz: %v %v", res, err)
	} else {
		res.Body.Close()
	}
}

// TestNoTokenLeaks runs callbacks good and bad, then looks for any token
// in every log line (the access log on), every metric (names and labels)
// and every subject stored in any stream or bucket.
func TestNoTokenLeaks(t *testing.T) {
	logs := &testlog.Buffer{}
	r, nc := startChimeWith(t, logs, func(c *config.Config) { c.HTTPAccessLog = true })
	base := "http://" + r.HTTPAddr()
	var tokens []string
	tokenOf := func(url string) string { return url[strings.LastIndex(url, "/")+1:] }
	for _, agent := range []string{"leak-a", "leak-b"} {
		for _, url := range startAgent(t, nc, agent) {
			tokens = append(tokens, tokenOf(url))
			post(t, url, "application/json", []byte(`{"text":"hello"}`))
			post(t, url, "application/json", []byte(`{"text":`))
			post(t, url, "text/plain", bytes.Repeat([]byte("a"), callbacks.MaxCallbackBody+1))
			post(t, strings.Replace(strings.Replace(url, "/wake/", "/x/", 1), "/enqueue/", "/wake/", 1), "", nil)
			req, _ := http.NewRequest("GET", url, nil)
			if res, err := http.DefaultClient.Do(req); err == nil {
				res.Body.Close()
			}
		}
		_, body := post(t, base+"/api/control/agents/"+agent+"/reset-callback", "", nil)
		var reset callbacks.ResetReply
		_ = json.Unmarshal(body, &reset)
		tokens = append(tokens, tokenOf(reset.TriggerURL))
		post(t, reset.TriggerURL, "", nil)
		post(t, base+"/api/control/agents/"+agent+"/stop", "", nil)
		post(t, reset.TriggerURL, "", nil) // rejected now
	}
	for _, tok := range tokens {
		if !strings.HasPrefix(tok, "chime_cb_") {
			t.Fatalf("token %q", tok)
		}
	}

	res, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(res.Body)
	res.Body.Close()

	js, _ := jetstream.New(nc)
	var stored strings.Builder
	for name := range js.StreamNames(context.Background()).Name() {
		s, err := js.Stream(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(context.Background(), jetstream.WithSubjectFilter(">"))
		if err != nil {
			t.Fatal(err)
		}
		for subj := range info.State.Subjects {
			stored.WriteString(subj + "\n")
		}
	}
	if !strings.Contains(stored.String(), "callback.event.") || !strings.Contains(logs.String(), "chime ready") {
		t.Fatalf("nothing collected: subjects %q", stored.String())
	}
	// The access log and the operator's changes are there, tokens cut.
	for _, want := range []string{
		`msg=request component=http method=POST path=/api/callbacks/... status=200`,
		`msg="operator action" component=api action=lifecycle.stop agent_id=leak-a surface=http`,
		`msg="operator action" component=api action=trigger.reset agent_id=leak-b surface=http`,
		`msg="callbacks refused" component=api surface=http`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log has no %s", want)
		}
	}
	for _, tok := range tokens {
		secret := strings.TrimPrefix(tok, "chime_cb_")
		for what, text := range map[string]string{"log": logs.String(), "metrics": string(metrics), "stream subjects": stored.String()} {
			if strings.Contains(text, secret) {
				t.Errorf("a token appears in the %s", what)
			}
		}
	}
}

func TestCallbackConcurrentWakesWithoutInboxConsumer(t *testing.T) {
	_, nc := startChime(t)
	wake := startAgent(t, nc, "burst")[callbacks.ModeWakeHint]
	inbox := inboxOf(t, nc, "burst")
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, body := post(t, wake, "", nil)
			if status != 200 || !strings.Contains(string(body), `"disposition":"triggered"`) {
				errs <- fmt.Sprintf("%d %s", status, body)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Errorf("concurrent wake: %s", e)
	}
	for range n {
		next(t, inbox)
	}
}

func TestCallbackWakeRetryNeverSwallowsAWake(t *testing.T) {
	_, nc := startChime(t)
	wake := startAgent(t, nc, "retry")[callbacks.ModeWakeHint]
	ctx := context.Background()
	js, _ := jetstream.New(nc)
	cons, err := js.CreateOrUpdateConsumer(ctx, engine.InboxStream, jetstream.ConsumerConfig{
		Durable: agents.InboxConsumer("retry"), FilterSubject: subjects.Inbox("retry"), AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	take := func() string {
		t.Helper()
		msgs, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		m, ok := <-msgs.Messages()
		if !ok {
			t.Fatal("no wake hint")
		}
		var env subjects.Envelope
		_ = json.Unmarshal(m.Data(), &env)
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
		return env.Text
	}
	for round := range 5 {
		key := fmt.Sprintf("delivery-%d", round)
		status, body := post(t, wake, "text/plain", []byte("original"), "Idempotency-Key", key)
		accepted(t, status, body, "retry", callbacks.ModeWakeHint, callbacks.DispositionTriggered)
		if got := take(); got != "original" {
			t.Fatalf("round %d: %q", round, got)
		}
		// The sender retries while a fresh wake arrives: the retry is a
		// duplicate, the fresh wake is delivered.
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			status, body := post(t, wake, "text/plain", []byte("original"), "Idempotency-Key", key)
			if status != 200 || !strings.Contains(string(body), `"disposition":"duplicate"`) {
				t.Errorf("retry: %d %s", status, body)
			}
		}()
		go func() {
			defer wg.Done()
			// Folded into the original while chime has not yet seen its
			// ack, or delivered: either way it must reach the agent.
			status, body := post(t, wake, "text/plain", []byte("fresh"))
			if status != 200 || strings.Contains(string(body), `"disposition":"duplicate"`) {
				t.Errorf("fresh wake: %d %s", status, body)
			}
		}()
		wg.Wait()
		if got := take(); got != "fresh" {
			t.Fatalf("round %d: the fresh wake became %q", round, got)
		}
	}
}

func TestCallbackLargeEscapableBody(t *testing.T) {
	_, nc := startChime(t)
	enqueue := startAgent(t, nc, "big")[callbacks.ModeEnqueueMessage]
	inbox := inboxOf(t, nc, "big")
	body := strings.Repeat("<a&b>", 50000) // 250 KB; HTML-escaped it would be 1.2 MB
	status, reply := post(t, enqueue, "text/plain", []byte(body))
	accepted(t, status, reply, "big", callbacks.ModeEnqueueMessage, callbacks.DispositionEnqueued)
	if env := next(t, inbox); env.Text != body {
		t.Errorf("delivered %d bytes, want the %d sent", len(env.Text), len(body))
	}
}

// TestCallbackStoppedAgentActiveToken: the agent's status alone refuses a
// callback, even while its trigger is still active.
func TestCallbackStoppedAgentActiveToken(t *testing.T) {
	_, nc := startChime(t)
	enqueue := startAgent(t, nc, "paused")[callbacks.ModeEnqueueMessage]
	ctx := context.Background()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(ctx, engine.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	setStatus := func(status agents.AgentStatus) {
		e, err := kv.Get(ctx, "paused")
		if err != nil {
			t.Fatal(err)
		}
		var st agents.AgentState
		_ = json.Unmarshal(e.Value(), &st)
		st.Status = status
		b, _ := json.Marshal(st)
		if _, err := kv.Put(ctx, "paused", b); err != nil {
			t.Fatal(err)
		}
	}
	setStatus(agents.AgentStopped)
	testwait.Eventually(t, 5*time.Second, func() bool {
		status, _ := post(t, enqueue, "text/plain", []byte("x"))
		return status == 403
	})
	setStatus(agents.AgentActive)
	testwait.Eventually(t, 5*time.Second, func() bool {
		status, _ := post(t, enqueue, "text/plain", []byte("x"))
		return status == 200
	})
}

// TestConcurrentResets: resets of one agent run one at a time, so exactly
// one default per mode stays active.
func TestConcurrentResets(t *testing.T) {
	r, nc := startChime(t)
	startAgent(t, nc, "racy")
	base := "http://" + r.HTTPAddr()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if status, body := post(t, base+"/api/control/agents/racy/reset-callback", "", nil); status != 200 {
				t.Errorf("reset: %d %s", status, body)
			}
		}()
	}
	wg.Wait()
	res, err := http.Get(base + "/api/agents/racy/triggers")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var list struct{ Triggers []callbacks.TriggerView }
	_ = json.NewDecoder(res.Body).Decode(&list)
	active := map[callbacks.DeliveryMode]int{}
	for _, tr := range list.Triggers {
		if tr.Status == callbacks.TriggerActive {
			active[tr.Mode]++
		}
	}
	if active[callbacks.ModeWakeHint] != 1 || active[callbacks.ModeEnqueueMessage] != 1 || len(list.Triggers) != 10 {
		t.Errorf("after 8 concurrent resets: active %v of %d triggers", active, len(list.Triggers))
	}
}

// TestCallbackCoalescingWithChimesCursor: an agent that reads its inbox
// through chime (inbox.fetch, inbox.ack) has its wakes folded into the
// hint it has not acked yet, as one with its own consumer.
func TestCallbackCoalescingWithChimesCursor(t *testing.T) {
	_, nc := startChime(t)
	urls := startAgent(t, nc, "cur")
	wake, enqueue := urls[callbacks.ModeWakeHint], urls[callbacks.ModeEnqueueMessage]
	ctx := context.Background()
	c, _ := client.New(nc, "cur")
	fetch := func(want int) []deliveries.InboxDelivery {
		t.Helper()
		var got []deliveries.InboxDelivery
		for deadline := time.Now().Add(5 * time.Second); len(got) < want && time.Now().Before(deadline); {
			r, err := c.FetchInbox(ctx, 0, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			got = r.Deliveries
		}
		return got
	}
	text := func(d deliveries.InboxDelivery) string {
		var env subjects.Envelope
		_ = json.Unmarshal(d.Envelope, &env)
		return env.Text
	}
	// Until it first acks, it reads nothing reliably: every wake is
	// delivered.
	status, body := post(t, enqueue, "text/plain", []byte("hello"))
	accepted(t, status, body, "cur", callbacks.ModeEnqueueMessage, callbacks.DispositionEnqueued)
	hello := fetch(1)
	if len(hello) != 1 {
		t.Fatalf("fetched %d", len(hello))
	}
	if _, err := c.AckInbox(ctx, hello[0].Seq); err != nil {
		t.Fatal(err)
	}
	status, body = post(t, wake, "text/plain", []byte("first"))
	accepted(t, status, body, "cur", callbacks.ModeWakeHint, callbacks.DispositionTriggered)
	status, body = post(t, wake, "text/plain", []byte("second"))
	accepted(t, status, body, "cur", callbacks.ModeWakeHint, callbacks.DispositionCoalesced)
	first := fetch(1)
	if len(first) != 1 || text(first[0]) != "first" {
		t.Fatalf("pending hint %+v", first)
	}
	// Fetched but not acked: still pending.
	status, body = post(t, wake, "text/plain", []byte("third"))
	accepted(t, status, body, "cur", callbacks.ModeWakeHint, callbacks.DispositionCoalesced)
	if _, err := c.AckInbox(ctx, first[0].Seq); err != nil {
		t.Fatal(err)
	}
	status, body = post(t, wake, "text/plain", []byte("fourth"))
	accepted(t, status, body, "cur", callbacks.ModeWakeHint, callbacks.DispositionTriggered)
	if rest := fetch(1); len(rest) != 1 || text(rest[0]) != "fourth" {
		t.Errorf("after the ack the inbox holds %+v, want only the fourth (second and third coalesced)", rest)
	}
}
