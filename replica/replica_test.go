package replica_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testlog"
	"github.com/chime-nats/chime/internal/testwait"
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

// TestStartSweepsRecordsKeptWithoutTTL: buckets from before records
// expired, holding finished records without a TTL, get per-message TTLs
// in place at start, and the start's sweep gives those records one: they
// go after what is left of their retention, live ones stay.
func TestStartSweepsRecordsKeptWithoutTTL(t *testing.T) {
	ns := natstest.Server(t)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	old := map[string]map[string]string{
		engine.TimersBucket: {
			"a.tmr_done": `{"id":"tmr_done","agent_id":"a","status":"cancelled"}`,
			"a.tmr_live": `{"id":"tmr_live","agent_id":"a","status":"active","next_fire_at":"2999-01-01T00:00:00Z"}`,
		},
		engine.WaitsBucket: {
			"a.w_done": `{"wait_id":"w_done","agent_id":"a","status":"completed","target_time":"2020-01-01T00:00:00Z"}`,
			"a.w_live": `{"wait_id":"w_live","agent_id":"a","status":"waiting","target_time":"2999-01-01T00:00:00Z"}`,
		},
		engine.TriggersBucket: {
			"rec.a.trg_old":  `{"external_trigger_id":"trg_old","agent_id":"a","status":"revoked"}`,
			"rec.a.trg_live": `{"external_trigger_id":"trg_live","agent_id":"a","status":"active"}`,
		},
	}
	for bucket, recs := range old {
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1})
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range recs {
			if _, err := kv.Put(ctx, k, []byte(v)); err != nil {
				t.Fatal(err)
			}
		}
	}
	logs := &testlog.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	r, err := replica.Start(ctx, &config.Config{
		NATSURL: ns.ClientURL(), JSReplicas: 1, ReplicaID: "sweep", Shards: 4, LeaseTTL: 2 * time.Second,
		InboxMaxAge: time.Hour, EventMaxAge: time.Hour, DedupWindow: time.Minute, RecordRetention: 2 * time.Second,
	}, log, "0.0.0-test")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop(context.Background())
	testwait.Until(t, 10*time.Second, func() (bool, string) {
		left := 0
		for bucket, recs := range old {
			kv, err := js.KeyValue(ctx, bucket)
			if err != nil {
				t.Fatal(err)
			}
			for k := range recs {
				if _, err := kv.Get(ctx, k); err == nil {
					left++
				}
			}
		}
		return left == 3, fmt.Sprintf("%d of the 6 records left", left)
	}, "the 3 live records left")
	for bucket, recs := range old {
		kv, _ := js.KeyValue(ctx, bucket)
		for k := range recs {
			_, err := kv.Get(ctx, k)
			if live := strings.Contains(k, "live"); live != (err == nil) {
				t.Errorf("%s %s: live %v, get %v", bucket, k, live, err)
			}
		}
	}
	if !strings.Contains(logs.String(), "records kept without a TTL now expire") {
		t.Errorf("no sweep logged:\n%s", logs.String())
	}
}
