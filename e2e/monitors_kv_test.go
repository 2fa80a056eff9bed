package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/monitors"
	"github.com/chime-nats/chime/partitions"
	"github.com/chime-nats/chime/subjects"
)

// TestKVMonitorSurvivesReplicaAndServerDeaths: two replicas watch a KV
// prefix for an agent while a writer creates one key after another; the
// replica watching is SIGKILLed, later the NATS server is shut down and
// started again on its store: every change reaches the inbox exactly
// once, in order (the watch resumes from the record's revision on the
// other replica, and its ordered consumer from the last revision passed
// on after the server's restart).
func TestKVMonitorSurvivesReplicaAndServerDeaths(t *testing.T) {
	addr, dir := freeAddr(t), filepath.Join(t.TempDir(), "js")
	opts := engine.EmbeddedOptions{Listen: addr, DataDir: dir, Name: "kvmon"}
	startNATS := func() *server.Server {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ns, err := engine.StartEmbedded(ctx, opts, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		return ns
	}
	ns := startNATS()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	procs := map[string]*proc{}
	for _, id := range []string{"r0", "r1"} {
		procs[id] = startServe(t, id, "CHIME_NATS_URL=nats://"+addr, "CHIME_MONITOR_KV=builds/ci.>")
	}
	nc, err := nats.Connect("nats://"+addr, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "builds"})
	if err != nil {
		t.Fatal(err)
	}
	leases, err := js.KeyValue(ctx, engine.LeasesBucket)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "shards shared", func() bool {
		held := map[string]bool{}
		for _, id := range shardOwners(ctx, leases) {
			held[id] = true
		}
		return held["r0"] && held["r1"] && !held[""]
	})
	msg, err := nc.Request(subjects.Agent("kvmon", monitors.ActionStart), []byte(`{"description":"ci","kv":"builds/ci.>","persistent":true}`), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var m monitors.Monitor
	if err := json.Unmarshal(msg.Data, &m); err != nil || m.ID == "" {
		t.Fatalf("start: %s %v", msg.Data, err)
	}
	owners := shardOwners(ctx, leases)
	holder := owners[partitions.ShardOf(monitors.Key("kvmon", m.ID), len(owners))]

	// Each change creates its own key: a create retried after the server
	// applied it fails "key exists" rather than making a second change.
	const n = 120
	put := func(i int) {
		t.Helper()
		for {
			pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := kv.Create(pctx, fmt.Sprintf("ci.k%03d", i), fmt.Appendf(nil, "build %d", i))
			pcancel()
			if err == nil || errors.Is(err, jetstream.ErrKeyExists) {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("put %d: %v", i, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for i := range n {
		switch i {
		case 30:
			procs[holder].kill()
		case 70:
			ns.Shutdown()
			ns.WaitForShutdown()
			time.Sleep(500 * time.Millisecond)
			ns = startNATS()
		}
		put(i)
		time.Sleep(60 * time.Millisecond)
	}

	var lines []string
	eventually(t, 30*time.Second, "every change delivered", func() bool {
		lines = lines[:0]
		ids := map[string]bool{}
		for _, env := range monitorEnvelopes(t, nc, subjects.KindMonitorEvent) {
			if ids[env.ID] {
				t.Fatalf("envelope %s stored twice", env.ID)
			}
			ids[env.ID] = true
			var d monitors.EventData
			if err := json.Unmarshal(env.Data, &d); err != nil {
				t.Fatal(err)
			}
			lines = append(lines, d.Lines...)
		}
		return len(lines) >= n
	})
	if len(lines) != n {
		t.Fatalf("%d lines for %d changes", len(lines), n)
	}
	for i, l := range lines {
		if want := fmt.Sprintf("ci.k%03d PUT build %d", i, i); l != want {
			t.Fatalf("line %d: %q, want %q", i, l, want)
		}
	}
}
