package engine_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/natstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var topo = engine.Topology{Replicas: 1, LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour, DedupWindow: time.Minute}

func connect(t *testing.T) jetstream.JetStream {
	t.Helper()
	ns := natstest.Server(t)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// TestProvisionMovesLeasesToFile: a memory-stored leases bucket of an older
// version is made anew, file-stored, so leases survive a server restart.
func TestProvisionMovesLeasesToFile(t *testing.T) {
	js := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: engine.LeasesBucket, TTL: time.Second, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.Provision(ctx, js, topo); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "KV_"+engine.LeasesBucket)
	if err != nil || s.CachedInfo().Config.Storage != jetstream.FileStorage {
		t.Fatalf("leases bucket after provisioning: %v %+v", err, s)
	}
}

// TestHealRecreatesWhatIsMissing: Heal leaves present resources alone and
// re-creates deleted ones.
func TestHealRecreatesWhatIsMissing(t *testing.T) {
	js := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := engine.Provision(ctx, js, topo); err != nil {
		t.Fatal(err)
	}
	if healed, err := engine.Heal(ctx, js, topo); err != nil || len(healed) != 0 {
		t.Fatalf("nothing missing, healed %v (%v)", healed, err)
	}
	if err := js.DeleteStream(ctx, engine.InboxStream); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(ctx, engine.TimersBucket); err != nil {
		t.Fatal(err)
	}
	healed, err := engine.Heal(ctx, js, topo)
	slices.Sort(healed)
	if err != nil || !slices.Equal(healed, []string{engine.InboxStream, engine.TimersBucket}) {
		t.Fatalf("healed %v (%v)", healed, err)
	}
	if _, err := js.KeyValue(ctx, engine.TimersBucket); err != nil {
		t.Fatal(err)
	}
}

// TestProvisionEnablesTTLsInPlace: record buckets made before records
// expired (no per-message TTLs) are changed in place, keeping their
// records; the healer re-creates them with TTLs too.
func TestProvisionEnablesTTLsInPlace(t *testing.T) {
	js := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, b := range []string{engine.TimersBucket, engine.WaitsBucket, engine.TriggersBucket} {
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b, History: 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, "a.old", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	res, err := engine.Provision(ctx, js, topo)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range []jetstream.KeyValue{res.Timers, res.Waits, res.Triggers} {
		s, err := js.Stream(ctx, "KV_"+kv.Bucket())
		if err != nil {
			t.Fatal(err)
		}
		if c := s.CachedInfo().Config; !c.AllowMsgTTL || c.SubjectDeleteMarkerTTL != engine.DefaultMarkerTTL {
			t.Errorf("%s: allow_msg_ttl %v, marker TTL %v", kv.Bucket(), c.AllowMsgTTL, c.SubjectDeleteMarkerTTL)
		}
		if _, err := kv.Get(ctx, "a.old"); err != nil {
			t.Errorf("%s lost its record: %v", kv.Bucket(), err)
		}
	}
	if err := js.DeleteKeyValue(ctx, engine.WaitsBucket); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.Heal(ctx, js, topo); err != nil {
		t.Fatal(err)
	}
	if s, err := js.Stream(ctx, "KV_"+engine.WaitsBucket); err != nil || !s.CachedInfo().Config.AllowMsgTTL {
		t.Fatalf("healed waits bucket: %v", err)
	}
}
