package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// TestBucketAtItsLimit: timer creates into a timers bucket at its byte
// limit are refused with bucket_full (507, naming the bucket), at once;
// every timer stored before is still there, and the other buckets still
// take writes.
func TestBucketAtItsLimit(t *testing.T) {
	ns := natstest.Server(t)
	_, res := natstest.ProvisionedAs(t, ns, engine.Topology{
		Replicas: 1, LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour, DedupWindow: time.Minute,
		MaxBytes: map[string]int64{engine.TimersBucket: 32 << 10},
	})
	reg := prometheus.NewRegistry()
	ops := NewOperations(Config{Timers: timers.NewStore(res.Timers, nil, kvrec.Retention{}), Registerer: reg})
	h := NewHandler(ops, reg, func() (bool, string) { return true, "" }, access.Resolver{})
	create := func(agent string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/api/control/agents/"+agent+"/timers", strings.NewReader(`{"duration_ms":3600000,"summary":"`+strings.Repeat("s", 200)+`"}`))
		req.Host = "127.0.0.1"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	var stored []string
	var refused *httptest.ResponseRecorder
	for i := 0; refused == nil; i++ {
		if i > 1000 {
			t.Fatal("32 KiB bucket never full")
		}
		start := time.Now()
		rec := create(fmt.Sprintf("agent%d", i%3))
		switch rec.Code {
		case http.StatusCreated:
			var tm timers.Timer
			if err := json.Unmarshal(rec.Body.Bytes(), &tm); err != nil {
				t.Fatal(err)
			}
			stored = append(stored, tm.AgentID+"."+tm.ID)
		default:
			refused = rec
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("refused after %v: a full bucket is not worth waiting on", took)
			}
		}
	}
	t.Logf("%d timers stored, then: %d %s", len(stored), refused.Code, refused.Body)
	var reply subjects.ErrorReply
	if err := json.Unmarshal(refused.Body.Bytes(), &reply); err != nil || refused.Code != http.StatusInsufficientStorage ||
		reply.Error.Code != subjects.CodeBucketFull || !strings.Contains(reply.Error.Message, engine.TimersBucket) {
		t.Fatalf("at the limit: %d %s, want 507 bucket_full naming %s", refused.Code, refused.Body, engine.TimersBucket)
	}
	if refused.Header().Get("Retry-After") != "" {
		t.Errorf("Retry-After %q: waiting a second does not free a bucket", refused.Header().Get("Retry-After"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, key := range stored {
		if _, err := res.Timers.KVs[0].Get(ctx, key); err != nil {
			t.Errorf("timer %s stored before the limit: %v", key, err)
		}
	}
	if n := countKeys(ctx, t, res.Timers.KVs[0]); n != len(stored) {
		t.Errorf("bucket holds %d timers, %d were stored", n, len(stored))
	}
	if _, err := res.Waits.KVs[0].Put(ctx, "agent0.w1", []byte(`{}`)); err != nil {
		t.Errorf("another bucket refused a write: %v", err)
	}
}

func countKeys(ctx context.Context, t *testing.T, kv jetstream.KeyValue) int {
	t.Helper()
	l, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range l.Keys() {
		n++
	}
	return n
}

// TestAnswerStorageFull maps writes refused for room, over NATS micro as
// over HTTP: storage_full or bucket_full (507, no Retry-After), before the
// outage rule that the same engine code would otherwise meet; a read that
// saw "insufficient resources" until its deadline stays unavailable.
func TestAnswerStorageFull(t *testing.T) {
	full := fmt.Errorf("nats: %w", &jetstream.APIError{Code: 503, ErrorCode: 10023, Description: "insufficient resources"})
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"store full", fmt.Errorf("notifications: store n1: %w", full), subjects.CodeStorageFull},
		{"account full", &jetstream.APIError{Code: 400, ErrorCode: 10002, Description: "resource limits exceeded for account"}, subjects.CodeStorageFull},
		{"bucket full", &jetstream.APIError{Code: 503, ErrorCode: 10077, Description: "maximum bytes exceeded"}, subjects.CodeBucketFull},
		{"read until the deadline", fmt.Errorf("get k: %w: %w", kvrec.ErrUnavailable, full), subjects.CodeUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := answerError(tc.err)
			if !errors.Is(got, &subjects.Error{Code: tc.want}) {
				t.Fatalf("answerError(%v) = %v, want %s", tc.err, got, tc.want)
			}
			if tc.want == subjects.CodeUnavailable {
				return
			}
			if got := httpStatus(&subjects.Error{Code: tc.want}); got != http.StatusInsufficientStorage {
				t.Fatalf("HTTP status %d, want 507", got)
			}
			msg := answer(stubRequest{}, nil, got)
			if msg.Header.Get(micro.ErrorCodeHeader) != "507" || msg.Header.Get("Retry-After") != "" {
				t.Fatalf("NATS headers %v", msg.Header)
			}
			var reply subjects.ErrorReply
			if err := json.Unmarshal(msg.Data, &reply); err != nil || reply.Error.Code != tc.want || strings.Contains(reply.Error.Message, "nats") {
				t.Fatalf("NATS body %s (%v)", msg.Data, err)
			}
		})
	}
}
