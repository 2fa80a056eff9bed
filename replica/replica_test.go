package replica_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/replica"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestStartFailsAnywhereAndReturns: a start cut short at any point (here
// by its context, from a few milliseconds to well into the start) returns
// its error, or a replica that stops, within bounds: it never hangs on
// what it had started (a lease keeper that never ran used to).
func TestStartFailsAnywhereAndReturns(t *testing.T) {
	ns := natstest.Server(t)
	// A whole start takes tens of milliseconds here: cut it every 4 ms.
	for limit := time.Millisecond; limit < 200*time.Millisecond; limit += 4 * time.Millisecond {
		cfg := &config.Config{
			NATSURL: ns.ClientURL(), JSReplicas: 1, HTTPAddr: "127.0.0.1:0", ReplicaID: "cut", Shards: 4,
			LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour, DedupWindow: time.Minute,
		}
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		done := make(chan struct{})
		go func() {
			defer close(done)
			r, err := replica.Start(ctx, cfg, slog.New(slog.DiscardHandler), "test")
			if err == nil {
				sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
				r.Stop(sctx)
				scancel()
			}
		}()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("start cut at %v still running after 30 s", limit)
		}
		cancel()
	}
}

// TestStartWithoutNATS: no server at the URL is an error at once.
func TestStartWithoutNATS(t *testing.T) {
	cfg := &config.Config{NATSURL: "nats://127.0.0.1:1", JSReplicas: 1, ReplicaID: "none", Shards: 4, LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := replica.Start(ctx, cfg, slog.New(slog.DiscardHandler), "test"); err == nil {
		t.Fatal("started without NATS")
	}
}
