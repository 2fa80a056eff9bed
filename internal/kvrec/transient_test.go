package kvrec

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// jetStreamServer starts an embedded JetStream server on 127.0.0.1 (not
// natstest's: the engine it starts through imports this package).
// recsBucket starts an embedded JetStream server and returns a connection
// to it, its JetStream and a bucket "recs".
func recsBucket(t *testing.T, ctx context.Context) (*nats.Conn, jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "recs"})
	if err != nil {
		t.Fatal(err)
	}
	return nc, js, kv
}

// TestTransient classifies errors as a real server and the clients produce
// them. The cluster errors cannot come from one server; they are built the
// way the clients decode them from the server's reply.
func TestTransient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, js, kv := recsBucket(t, ctx)
	rev, err := kv.Create(ctx, "k", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	silent, err := nc.Subscribe("silent", func(*nats.Msg) {}) // interest that never answers
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = silent.Unsubscribe() }()
	expired, cancelExpired := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancelExpired()
	cancelled, cancelNow := context.WithCancel(ctx)
	cancelNow()
	closed, err := nats.Connect(nc.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	closedKV, err := jetstream.New(closed)
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()

	second := func(_ any, err error) error { return err }
	api := func(code int, errCode uint16, desc string) error {
		// publish acks wrap the reply's error this way
		return fmt.Errorf("nats: %w", &jetstream.APIError{Code: code, ErrorCode: jetstream.ErrorCode(errCode), Description: desc})
	}
	legacy := func(code int, errCode uint16, desc string) error {
		return &nats.APIError{Code: code, ErrorCode: nats.ErrorCode(errCode), Description: desc}
	}

	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		// answers: the engine is up and said something definite
		{"key not found", second(kv.Get(ctx, "missing")), false},
		{"revision mismatch", second(kv.Update(ctx, "k", []byte(`{}`), rev+10)), false},
		{"key exists", second(kv.Create(ctx, "k", []byte(`{}`))), false},
		{"bucket not found", second(js.KeyValue(ctx, "missing")), false},
		{"stream not found", second(js.Stream(ctx, "MISSING")), false},
		{"stream not found, legacy API", legacy(404, 10059, "stream not found"), false},
		{"wrong last sequence", api(400, 10071, "wrong last sequence: 3"), false},
		{"jetstream not enabled", api(503, 10076, "jetstream not enabled"), false},
		{"contended", fmt.Errorf("update k: %w", ErrContended), false},
		{"decode", func() error { _, _, err := Get[int](ctx, kv, "k"); return err }(), false},
		// the caller's own end, and a connection gone for good
		{"caller deadline", second(kv.Get(expired, "k")), false},
		{"caller cancel", second(kv.Get(cancelled, "k")), false},
		{"connection closed", second(closedKV.AccountInfo(ctx)), false},
		// the engine not answering
		{"no responders", second(nc.Request("nobody.home", nil, time.Second)), true},
		{"no stream response", second(js.Publish(ctx, "no.stream.here", nil, jetstream.WithRetryAttempts(0))), true},
		{"request timeout", second(nc.Request("silent", nil, 50*time.Millisecond)), true},
		{"attempt timeout", second(attempt(ctx, func(ctx context.Context) (*nats.Msg, error) {
			return nc.RequestWithContext(ctx, "silent", nil)
		})), true},
		{"reconnecting", fmt.Errorf("get k: %w", nats.ErrConnectionReconnecting), true},
		{"disconnected", nats.ErrDisconnected, true},
		{"reconnect buffer full", nats.ErrReconnectBufExceeded, true},
		{"no heartbeat", jetstream.ErrNoHeartbeat, true},
		{"consumer leadership changed", nats.ErrConsumerLeadershipChanged, true},
		// the cluster in motion, as the server words it
		{"system temporarily unavailable", api(503, 10008, "JetStream system temporarily unavailable"), true},
		{"system temporarily unavailable, legacy API", legacy(503, 10008, "JetStream system temporarily unavailable"), true},
		{"not leader", api(500, 10009, "JetStream cluster can not handle request"), true},
		{"no suitable peers", api(400, 10005, "no suitable peers for placement"), true},
		{"incomplete results", api(503, 10004, "incomplete results"), true},
		{"insufficient resources", legacy(503, 10023, "insufficient resources"), true},
		{"too many requests", api(429, 10167, "too many requests"), true},
		{"unavailable until the deadline", fmt.Errorf("get k: %w: %w", ErrUnavailable, context.DeadlineExceeded), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.err == nil && tc.name != "nil" {
				t.Fatal("the call meant to fail succeeded")
			}
			if got := Transient(tc.err); got != tc.want {
				t.Fatalf("Transient(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
	if !errors.Is(second(kv.Get(expired, "k")), context.DeadlineExceeded) {
		t.Fatal("an expired context should fail the call with DeadlineExceeded")
	}
}
