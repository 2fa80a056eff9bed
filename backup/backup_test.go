package backup_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/chime-nats/chime/backup"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/schedule"
	"github.com/chime-nats/chime/partitions"
	"github.com/chime-nats/chime/subjects"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var update = flag.Bool("update", false, "rewrite docs/runbook.md's table of streams and buckets")

var topo = engine.Topology{Replicas: 1, Layout: partitions.Layout{Partitions: 2, Shards: 4}, LeaseTTL: 2 * time.Second, DedupWindow: time.Minute}

// server starts a server with chime's streams provisioned.
func server(t *testing.T) (*nats.Conn, *engine.Resources) {
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
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := engine.Provision(ctx, js, topo)
	if err != nil {
		t.Fatal(err)
	}
	if err := partitions.Check(ctx, js, topo.Layout, res.Timers.KVs[0], res.Waits.KVs[0]); err != nil {
		t.Fatal(err)
	}
	return nc, res
}

// dump is every stream's content: subject, data and headers of each
// message by sequence, and each stream's consumers.
func dump(t *testing.T, nc *nats.Conn) map[string][]string {
	t.Helper()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := map[string][]string{}
	for name := range js.StreamNames(ctx).Name() {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, _ := s.Info(ctx)
		var msgs []string
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if err != nil {
				continue // deleted
			}
			h, _ := json.Marshal(m.Header)
			msgs = append(msgs, m.Subject+" "+string(m.Data)+" "+string(h))
		}
		for c := range s.ListConsumers(ctx).Info() {
			msgs = append(msgs, "consumer "+c.Name)
		}
		out[name] = msgs
	}
	return out
}

func TestBackupAndRestore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, res := server(t)
	for i, kv := range append(res.Timers.KVs, res.Waits.KVs...) {
		if _, err := kv.Put(ctx, "0.a.t"+string(rune('a'+i)), []byte(`{"id":"x"}`)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := res.Notifications.Put(ctx, "a.n1", []byte(`{"message":"hello"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := res.Notifications.Put(ctx, "a.n2", []byte(`{"message":"bye"}`)); err != nil {
		t.Fatal(err)
	}
	if err := res.Notifications.Delete(ctx, "a.n2"); err != nil {
		t.Fatal(err)
	}
	if _, err := res.TaskOutputs.PutBytes(ctx, "a/t/h", bytes.Repeat([]byte("out "), 10000)); err != nil {
		t.Fatal(err)
	}
	if _, err := res.JS.Publish(ctx, subjects.Inbox("a"), []byte(`{"type":"timer_fired"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := res.JS.CreateOrUpdateConsumer(ctx, engine.InboxStream, jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	if _, err := res.Leases.Put(ctx, "replica.r1", []byte("r1")); err != nil {
		t.Fatal(err)
	}
	before := dump(t, nc)

	dir := filepath.Join(t.TempDir(), "b")
	m, err := backup.Backup(ctx, nc, backup.Options{Out: dir, ChimeVersion: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if m.Layout.Partitions != 2 || len(m.Skipped) != 2 {
		t.Errorf("manifest: layout %+v, skipped %+v", m.Layout, m.Skipped)
	}
	for _, s := range m.Streams {
		if s.Stream == "KV_chime_notifications" && (s.Messages != 2 || s.LastSeq != 3) {
			t.Errorf("notifications: %d messages to %d", s.Messages, s.LastSeq)
		}
	}
	if _, err := backup.Backup(ctx, nc, backup.Options{Out: dir}); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("a second backup into %s: %v", dir, err)
	}

	// Into the same server: refused while a replica is present, then
	// for the streams that exist.
	if _, _, err := backup.Restore(ctx, nc, backup.RestoreOptions{From: dir}); err == nil || !strings.Contains(err.Error(), "replicas are running on this server (r1)") {
		t.Errorf("restore with a replica running: %v", err)
	}
	if err := res.Leases.Delete(ctx, "replica.r1"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := backup.Restore(ctx, nc, backup.RestoreOptions{From: dir}); err == nil || !strings.Contains(err.Error(), "already exist") {
		t.Errorf("restore over existing streams: %v", err)
	}

	// Into a new server; then again over it with Replace.
	nc2, _ := server(t)
	done, _, err := backup.Restore(ctx, nc2, backup.RestoreOptions{From: dir, Replace: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != len(m.Streams) || !done[0].Replaced {
		t.Errorf("restored %+v", done)
	}
	after := dump(t, nc2)
	for _, s := range m.Streams {
		if strings.Join(before[s.Stream], "\n") != strings.Join(after[s.Stream], "\n") {
			t.Errorf("%s: before\n%s\nafter\n%s", s.Stream, strings.Join(before[s.Stream], "\n"), strings.Join(after[s.Stream], "\n"))
		}
	}
	for _, stream := range []string{"KV_chime_notifications", "KV_chime_timers_1", "OBJ_chime_task_outputs", "CHIME_INBOX"} {
		if len(after[stream]) == 0 {
			t.Errorf("%s restored empty", stream)
		}
	}
	js2, _ := jetstream.New(nc2)
	obs, err := js2.ObjectStore(ctx, engine.TaskOutputsBucket)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := obs.GetBytes(ctx, "a/t/h"); err != nil || len(b) != 40000 {
		t.Errorf("task output restored: %d bytes, %v", len(b), err)
	}
}

// TestScheduleSurvivesRestore: a message schedule (a WaitFor recheck, a
// task's settle) backed up before it is due is delivered after the
// restore, by the server restored into.
func TestScheduleSurvivesRestore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, res := server(t)
	due := time.Now().Add(3 * time.Second)
	if _, err := res.JS.PublishMsg(ctx, schedule.At(subjects.WaitForSchedule("a", "w1"), subjects.WaitForRecheck("a", "w1"), due)); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "b")
	if _, err := backup.Backup(ctx, nc, backup.Options{Out: dir}); err != nil {
		t.Fatal(err)
	}
	nc2, _ := server(t)
	if _, _, err := backup.Restore(ctx, nc2, backup.RestoreOptions{From: dir, Replace: true}); err != nil {
		t.Fatal(err)
	}
	js2, _ := jetstream.New(nc2)
	s, err := js2.Stream(ctx, engine.WaitForStream)
	if err != nil {
		t.Fatal(err)
	}
	for {
		m, err := s.GetLastMsgForSubject(ctx, subjects.WaitForRecheck("a", "w1"))
		if err == nil {
			if m.Time.Before(due) {
				t.Errorf("delivered at %v, due %v", m.Time, due)
			}
			return
		}
		if ctx.Err() != nil || time.Now().After(due.Add(10*time.Second)) {
			t.Fatalf("the restored schedule did not deliver: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestRestoreRefusesBadBackups(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, _ := server(t)
	dir := filepath.Join(t.TempDir(), "b")
	if _, err := backup.Backup(ctx, nc, backup.Options{Out: dir, ChimeVersion: "test"}); err != nil {
		t.Fatal(err)
	}
	manifest, err := os.ReadFile(filepath.Join(dir, backup.ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		spoil func(t *testing.T, dir string)
		err   string
	}{
		{"missing directory", func(t *testing.T, dir string) { os.RemoveAll(dir) }, "no such file or directory"},
		{"no manifest", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, backup.ManifestFile)) }, "has no manifest.json"},
		{"newer format", func(t *testing.T, dir string) {
			b := strings.Replace(string(manifest), `"format": 1`, `"format": 2`, 1)
			os.WriteFile(filepath.Join(dir, backup.ManifestFile), []byte(b), 0o600)
		}, "format 2 (chime test), newer than this chime reads (1)"},
		{"missing stream file", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "KV_chime_notifications", "stream.arc.s2"))
		}, "KV_chime_notifications/stream.arc.s2 is missing"},
		{"damaged stream file", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "KV_chime_tasks", "backup.json"), []byte("{}"), 0o600)
		}, "does not match its checksum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			copyDir := filepath.Join(t.TempDir(), "b")
			if err := os.CopyFS(copyDir, os.DirFS(dir)); err != nil {
				t.Fatal(err)
			}
			tc.spoil(t, copyDir)
			_, err := backup.ReadManifest(copyDir)
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("got %v, want %q", err, tc.err)
			}
		})
	}
}

// TestBackupNeedsChime: a server chime never started on is refused with
// the reason.
func TestBackupNeedsChime(t *testing.T) {
	ns := natstest.Server(t)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = backup.Backup(ctx, nc, backup.Options{Out: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "has chime started on it once?") {
		t.Errorf("got %v", err)
	}
}

const runbook = "../docs/runbook.md"

// TestRunbookTable holds the runbook's table of streams and buckets to
// the inventory, or rewrites it with -update.
func TestRunbookTable(t *testing.T) {
	doc, err := os.ReadFile(runbook)
	if err != nil {
		t.Fatal(err)
	}
	begin, end := "<!-- streams:begin", "<!-- streams:end -->"
	text := string(doc)
	i, j := strings.Index(text, begin), strings.Index(text, end)
	if i < 0 || j < i {
		t.Fatalf("%s has no %q ... %q block", runbook, begin, end)
	}
	i += strings.Index(text[i:], "\n") + 1
	want := backup.Table()
	if text[i:j] == want {
		return
	}
	if !*update {
		t.Fatalf("%s's table of streams differs from engine.Inventory; run go test ./backup -run TestRunbookTable -update\nwant:\n%s", runbook, want)
	}
	if err := os.WriteFile(runbook, []byte(text[:i]+want+text[j:]), 0o644); err != nil {
		t.Fatal(err)
	}
}
