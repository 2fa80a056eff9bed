package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testlog"
	"github.com/chime-nats/chime/partitions"
	"github.com/chime-nats/chime/quotas"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// outage provisions chime's buckets and stops the server: every storage
// call then waits until its deadline.
func outage(t *testing.T) (*nats.Conn, jetstream.KeyValue) {
	t.Helper()
	ns := natstest.Server(t)
	nc, res := natstest.Provisioned(t, ns)
	ns.Shutdown()
	ns.WaitForShutdown()
	return nc, res.Timers.KVs[0]
}

var (
	wantUnavailable = &subjects.Error{Code: subjects.CodeUnavailable}
	wantInternal    = &subjects.Error{Code: subjects.CodeInternal}
)

// TestAnswerError maps operation errors to answers: storage that did not
// get through before the deadline is unavailable with a retry hint, never
// internal; an operation's own wire error stands; anything else is a bug.
func TestAnswerError(t *testing.T) {
	_, kv := outage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, _, real := kvrec.Get[timers.Timer](ctx, kv, "demo.tmr_1")

	for _, tc := range []struct {
		name  string
		err   error
		want  error
		retry bool
	}{
		{"kvrec outage on a real server", fmt.Errorf("timers: get: %w", real), wantUnavailable, true},
		{"no responders", fmt.Errorf("timers: cancel tmr_1: %w", nats.ErrNoResponders), wantUnavailable, true},
		{"no stream response", jetstream.ErrNoStreamResponse, wantUnavailable, true},
		{"leader election", fmt.Errorf("nats: %w", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}), wantUnavailable, true},
		{"request deadline", fmt.Errorf("timers: get tmr_1: %w", context.DeadlineExceeded), wantUnavailable, true},
		{"operation's own error", fmt.Errorf("waits: %w", timers.ErrNotFound("tmr_1")), subjects.ErrTimerNotFound, false},
		{"operation's own unavailable", &subjects.Error{Code: subjects.CodeUnavailable, Message: "callbacks are not configured"}, wantUnavailable, false},
		{"bug", errors.New("nil map"), wantInternal, false},
		{"bucket missing (being healed)", fmt.Errorf("timers: get: %w", jetstream.ErrBucketNotFound), wantUnavailable, true},
		{"caller left or replica stopping", fmt.Errorf("timers: get: %w", context.Canceled), wantUnavailable, true},
		{"contended", kvrec.ErrContended, wantInternal, false},
		{"rate limited", fmt.Errorf("api: %w", &quotas.RateLimited{Wire: &subjects.Error{Code: subjects.CodeRateLimited, Message: "slow down"}, After: 20 * time.Millisecond}), subjects.ErrRateLimited, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := answerError(tc.err)
			if !errors.Is(got, tc.want) {
				t.Fatalf("answerError(%v) = %v, want %v", tc.err, got, tc.want)
			}
			after, retry := retryAfterSeconds(got)
			if retry != tc.retry || retry && after != "1" {
				t.Fatalf("retry hint %q %v, want %v", after, retry, tc.retry)
			}
			if e := subjects.AsError(got); strings.Contains(e.Message, "nats") || strings.Contains(e.Message, "deadline") {
				t.Fatalf("message %q says more than a caller needs", e.Message)
			}
		})
	}
	if !kvrec.Transient(real) {
		t.Fatalf("the outage error %v should be transient", real)
	}
}

// TestOutageAnswersUnavailable runs timer requests against a stopped
// server: each is answered at its deadline with unavailable (HTTP 503 and
// Retry-After: 1), logged as a warning, counted as unavailable.
func TestOutageAnswersUnavailable(t *testing.T) {
	nc, kv := outage(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var logs testlog.Buffer
	reg := prometheus.NewRegistry()
	ops := NewOperations(Config{
		Timers: timers.NewStore(partitions.Single(kv, 32), nil, kvrec.Retention{JS: js}), Registerer: reg,
		Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	h := NewHandler(ops, reg, func() (bool, string) { return true, "" }, access.Resolver{})
	for _, tc := range []struct{ method, path, body string }{
		{"GET", "/api/agents/demo/timers", ""},
		{"GET", "/api/agents/demo/timers/tmr_1", ""},
		{"POST", "/api/control/agents/demo/timers/tmr_1/cancel", ""},
		{"POST", "/api/control/agents/demo/timers", `{"duration_ms":1000}`},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			t.Parallel()
			// The request's own deadline stands in for requestTimeout.
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			req := httptest.NewRequestWithContext(ctx, tc.method, tc.path, strings.NewReader(tc.body))
			req.Host = "127.0.0.1" // httptest's example.com is no loopback host
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" {
				t.Fatalf("status %d Retry-After %q, want 503 and 1: %s", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
			}
			var reply subjects.ErrorReply
			if err := json.Unmarshal(rec.Body.Bytes(), &reply); err != nil || reply.Error.Code != subjects.CodeUnavailable || reply.Error.Message != unavailableMessage {
				t.Fatalf("body %s (%v)", rec.Body, err)
			}
		})
	}
	t.Cleanup(func() {
		out := logs.String()
		if strings.Contains(out, "level=ERROR") || !strings.Contains(out, "level=WARN") {
			t.Errorf("an outage is a warning, not an error:\n%s", out)
		}
		if !strings.Contains(out, "action=timer.cancel") {
			t.Errorf("the warning should name the request:\n%s", out)
		}
	})
}

// stubRequest is the micro request answer builds a reply for.
type stubRequest struct{ micro.Request }

func (stubRequest) Reply() string { return "_INBOX.reply" }

// TestNATSAnswerUnavailable: over NATS micro an outage is the same JSON
// error body, micro's error headers with 503, and the Retry-After hint.
func TestNATSAnswerUnavailable(t *testing.T) {
	msg := answer(stubRequest{}, nil, answerError(fmt.Errorf("timers: list: %w", kvrec.ErrUnavailable)))
	var reply subjects.ErrorReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil || reply.Error.Code != subjects.CodeUnavailable || reply.Error.Message != unavailableMessage {
		t.Fatalf("body %s (%v)", msg.Data, err)
	}
	if msg.Header.Get(micro.ErrorCodeHeader) != "503" || msg.Header.Get(micro.ErrorHeader) != unavailableMessage || msg.Header.Get("Retry-After") != "1" {
		t.Fatalf("headers %v", msg.Header)
	}
	internal := answer(stubRequest{}, nil, answerError(errors.New("bug")))
	if internal.Header.Get("Retry-After") != "" || internal.Header.Get(micro.ErrorCodeHeader) != "500" {
		t.Fatalf("internal headers %v", internal.Header)
	}
}
