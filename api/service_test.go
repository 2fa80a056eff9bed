package api

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/internal/metrictest"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/subjects"
)

// request is a micro.Request as micro hands one to a handler: the service
// under test answers on the connection, never through these methods.
type request struct {
	subject, reply string
}

func (r request) Respond([]byte, ...micro.RespondOpt) error               { return nil }
func (r request) RespondJSON(any, ...micro.RespondOpt) error              { return nil }
func (r request) Error(string, string, []byte, ...micro.RespondOpt) error { return nil }
func (r request) Data() []byte                                            { return nil }
func (r request) Headers() micro.Headers                                  { return nil }
func (r request) Subject() string                                         { return r.subject }
func (r request) Reply() string                                           { return r.reply }

// startService registers a service on an embedded server with at most
// slots requests in flight, and returns it with a connection whose
// inboxes take its replies.
func startService(t *testing.T, slots int) (*Service, *nats.Conn, *prometheus.Registry) {
	t.Helper()
	ns := natstest.Server(t)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	reg := prometheus.NewRegistry()
	ops := NewOperations(Config{Registerer: reg})
	s := NewService(ServiceConfig{NC: nc, Ops: ops, Version: "0.0.0-test", MaxConcurrent: slots, Registerer: reg})
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
	return s, nc, reg
}

// replyOn returns a request answered on a fresh inbox and that inbox's
// subscription.
func replyOn(t *testing.T, nc *nats.Conn) (request, *nats.Subscription) {
	t.Helper()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return request{subject: "agent.a1.timer.list", reply: inbox}, sub
}

// wireError reads the error of a reply on sub.
func wireError(t *testing.T, sub *nats.Subscription) subjects.Error {
	t.Helper()
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("no reply: %v", err)
	}
	var r subjects.ErrorReply
	if err := json.Unmarshal(m.Data, &r); err != nil || r.Error == nil {
		t.Fatalf("reply %q is no error (%v)", m.Data, err)
	}
	return *r.Error
}

// TestStopAnswersRequestsItHasNoSlotFor: a request micro hands over while
// Stop waits for the one in flight is answered unavailable at once, not
// left waiting for a slot Stop holds (which kept a stopping replica until
// its deadline).
func TestStopAnswersRequestsItHasNoSlotFor(t *testing.T) {
	s, nc, _ := startService(t, 1)
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock) // a failed run must not leave Stop waiting
	first, firstSub := replyOn(t, nc)
	s.handler(func(req micro.Request) *nats.Msg {
		<-release
		return answer(req, map[string]bool{"ok": true}, nil)
	})(first)

	stopped := make(chan error, 1)
	go func() { stopped <- s.Stop(context.Background()) }()
	select {
	case <-s.stopping:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not begin")
	}

	second, secondSub := replyOn(t, nc)
	handed := make(chan struct{})
	go func() {
		s.handler(func(req micro.Request) *nats.Msg { return answer(req, map[string]bool{"ok": true}, nil) })(second)
		close(handed)
	}()
	select {
	case <-handed:
	case <-time.After(5 * time.Second):
		t.Fatal("a request handed over while stopping waits for a slot")
	}
	if e := wireError(t, secondSub); e.Code != subjects.CodeUnavailable {
		t.Fatalf("second request: %+v, want unavailable", e)
	}

	unblock()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if m, err := firstSub.NextMsg(5 * time.Second); err != nil || string(m.Data) != `{"ok":true}` {
		t.Fatalf("the request in flight when Stop began: %v %q", err, m.Data)
	}
}

// TestHandlerPanicIsAnsweredInternal: a panic in an operation is counted
// and answered internal; the replica goes on serving.
func TestHandlerPanicIsAnsweredInternal(t *testing.T) {
	s, nc, reg := startService(t, 4)
	req, sub := replyOn(t, nc)
	s.handler(func(micro.Request) *nats.Msg { panic("boom") })(req)
	if e := wireError(t, sub); e.Code != subjects.CodeInternal || strings.Contains(e.Message, "boom") {
		t.Fatalf("reply %+v: want internal, without the panic's text", e)
	}
	if n := metrictest.Counter(t, reg, "chime_request_panics_total", map[string]string{"surface": "nats"}); n != 1 {
		t.Fatalf("chime_request_panics_total{surface=nats} = %v, want 1", n)
	}
	req, sub = replyOn(t, nc)
	s.handler(func(req micro.Request) *nats.Msg { return answer(req, map[string]bool{"ok": true}, nil) })(req)
	if m, err := sub.NextMsg(5 * time.Second); err != nil || string(m.Data) != `{"ok":true}` {
		t.Fatalf("after a panic: %v %q", err, m.Data)
	}
}

// TestReplyOverMaxPayloadIsRefusedClearly: a reply the server would refuse
// reaches the caller as reply_too_large, not as a timeout.
func TestReplyOverMaxPayloadIsRefusedClearly(t *testing.T) {
	s, nc, reg := startService(t, 4)
	req, sub := replyOn(t, nc)
	big := int(nc.MaxPayload()) + 1
	s.handler(func(req micro.Request) *nats.Msg {
		return &nats.Msg{Subject: req.Reply(), Data: make([]byte, big)}
	})(req)
	e := wireError(t, sub)
	if e.Code != subjects.CodeReplyTooLarge || !strings.Contains(e.Message, "limit") {
		t.Fatalf("reply %+v: want reply_too_large saying to ask for fewer", e)
	}
	if n := metrictest.Counter(t, reg, "chime_replies_failed_total", map[string]string{"reason": "too_large"}); n != 1 {
		t.Fatalf("chime_replies_failed_total{reason=too_large} = %v, want 1", n)
	}
}

// TestHTTPRoutePanicIsAnsweredInternal: over HTTP a panicking route is a
// 500 with the JSON error, counted like NATS; one that began its reply is
// cut off (http.ErrAbortHandler) rather than given a second status.
func TestHTTPRoutePanicIsAnsweredInternal(t *testing.T) {
	reg := prometheus.NewRegistry()
	ops := NewOperations(Config{Registerer: reg})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /boom", func(http.ResponseWriter, *http.Request) { panic("boom") })
	mux.HandleFunc("GET /stream", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("data: 1\n\n"))
		// As the event streams do, through the wrapper.
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("flush through the recovering writer: %v", err)
		}
		panic("mid-stream")
	})
	srv := httptest.NewServer(ops.recoverHTTP(mux))
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/boom")
	if err != nil {
		t.Fatal(err)
	}
	var body subjects.ErrorReply
	_ = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError || body.Error == nil || body.Error.Code != subjects.CodeInternal {
		t.Fatalf("GET /boom: %d %+v, want 500 internal", resp.StatusCode, body.Error)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/stream", nil)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		b := new(strings.Builder)
		_, readErr := io.Copy(b, resp.Body)
		resp.Body.Close()
		if readErr == nil && strings.Contains(b.String(), "internal") {
			t.Fatalf("a reply under way got an error appended: %q", b.String())
		}
	}
	if n := metrictest.Counter(t, reg, "chime_request_panics_total", map[string]string{"surface": "http"}); n != 2 {
		t.Fatalf("chime_request_panics_total{surface=http} = %v, want 2", n)
	}
}
