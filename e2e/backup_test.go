package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/backup"
	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/questions"
	"github.com/chime-nats/chime/timers"
)

// TestBackupRestore backs a chime with every kind of record up, wipes its
// data dir, restores the backup into it and compares every stream message
// by message (every KV key with its value and revision), then starts chime
// on it: the timers are there with their next fires, and a timer fires.
func TestBackupRestore(t *testing.T) {
	dataDir, natsAddr := filepath.Join(t.TempDir(), "data"), freeAddr(t)
	// The sharded layout: its partition buckets and counts are backed up too.
	env := []string{"CHIME_DATA_DIR=" + dataDir, "CHIME_NATS_LISTEN=" + natsAddr, "CHIME_PARTITIONS=3"}
	p := startServe(t, "bk1", env...)
	const agent = "bk"
	run := func(args ...string) string {
		t.Helper()
		out, errOut, code := chimeCLI(t, natsAddr, args...)
		if code != 0 {
			t.Fatalf("chime %v: exit %d: %s", args, code, errOut)
		}
		return out
	}
	// Records of every kind.
	run("agent", "start", "--agent", agent)
	cliTimer(t, natsAddr, "timer", "create", "--after-ms", "86400000", "--summary", "tomorrow", "--agent", agent)
	cliTimer(t, natsAddr, "timer", "create", "--after-ms", "3600000", "--every-ms", "3600000", "--summary", "hourly", "--agent", agent)
	cliTimer(t, natsAddr, "timer", "create", "--cron", "0 9 * * 1", "--tz", "Europe/Paris", "--summary", "mondays", "--agent", agent)
	run("wait", "request", "hours=1", "--agent", agent)
	run("task", "run", "--agent", agent, "--id", "small", "--", "sh", "-c", "echo hello")
	run("task", "run", "--agent", agent, "--id", "big", "--", "sh", "-c", "head -c 40000 /dev/zero | tr '\\0' x")
	run("notify", "send", "built", "--title", "CI", "--agent", agent)
	run("notify", "send", "deployed", "--priority", "20", "--agent", agent)
	run("monitor", "run", "--agent", agent, "--id", "m1", "--", "sh", "-c", "echo line 1; echo line 2")
	run("callback", "create", "--label", "ci", "--agent", agent)
	if out := run("agent", "token", "--agent", agent); !strings.Contains(out, "token") {
		t.Fatal("agent token: no token printed") // never the token itself in the log
	}
	nc, err := nats.Connect("nats://" + natsAddr)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := client.New(nc, agent)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := c.Ask(ctx, questions.QuestionItem{Title: "Ship it?", Options: []string{"yes", "no"}}); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	beforeTimers := listTimers(t, natsAddr, agent)
	if len(beforeTimers) != 3 {
		t.Fatalf("timers before: %d", len(beforeTimers))
	}
	beforeNotes := run("notify", "list", "--agent", agent)

	// Back up while chime runs, the state quiet; read it just before.
	nc, err = nats.Connect("nats://" + natsAddr)
	if err != nil {
		t.Fatal(err)
	}
	before := dumpStreams(t, nc)
	nc.Close()
	out := filepath.Join(t.TempDir(), "backup")
	start := time.Now()
	stdout, stderr, code := chimeCLI(t, natsAddr, "backup", "--out", out)
	if code != 0 {
		t.Fatalf("backup: exit %d: %s", code, stderr)
	}
	t.Logf("backup in %v: %s", time.Since(start).Round(time.Millisecond), oneLine(stdout))
	var summary struct {
		Streams  int    `json:"streams"`
		Messages uint64 `json:"messages"`
		Bytes    int64  `json:"bytes"`
	}
	if err := json.Unmarshal([]byte(stdout), &summary); err != nil || summary.Streams < 15 {
		t.Fatalf("backup summary %q: %v", stdout, err)
	}
	if !strings.Contains(stderr, "backed up") || !strings.Contains(stderr, "KV_chime_notifications") {
		t.Errorf("backup progress: %s", stderr)
	}
	m, err := backup.ReadManifest(out)
	if err != nil {
		t.Fatal(err)
	}
	if m.Layout.Partitions != 3 {
		t.Errorf("manifest layout %+v", m.Layout)
	}
	var streams []string
	for _, s := range m.Streams {
		streams = append(streams, s.Stream)
		if s.Stream == "OBJ_chime_task_outputs" && s.Messages == 0 || s.Stream == "KV_chime_notifications" && s.Messages < 3 {
			t.Errorf("%s backed up with %d messages", s.Stream, s.Messages)
		}
	}
	for _, want := range []string{"KV_chime_timers_2", "KV_chime_waits_1", "KV_chime_counts", "KV_chime_notifications", "KV_chime_monitors", "KV_chime_tokens"} {
		if !slices.Contains(streams, want) {
			t.Errorf("backed up %v, not %s", streams, want)
		}
	}
	if _, stderr, code := chimeCLI(t, natsAddr, "backup", "--out", out); code == 0 || !strings.Contains(stderr, "is not empty") {
		t.Errorf("backup into the same directory: exit %d: %s", code, stderr)
	}
	if _, stderr, code := chimeCLI(t, natsAddr, "restore", "--from", out, "--replace"); code == 0 || !strings.Contains(stderr, "replicas are running") {
		t.Errorf("restore while chime runs: exit %d: %s", code, stderr)
	}

	// Stop chime, wipe its data, restore into the data dir.
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
		p.exited <- nil
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not exit within 20s of SIGTERM")
	}
	if err := os.RemoveAll(dataDir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	stdout, stderr, code = chimeCLI(t, natsAddr, "restore", "--from", out, "--data-dir", dataDir)
	if code != 0 {
		t.Fatalf("restore: exit %d: %s", code, stderr)
	}
	var restored struct {
		Streams  int    `json:"streams"`
		Messages uint64 `json:"messages"`
	}
	if err := json.Unmarshal([]byte(stdout), &restored); err != nil || restored.Streams != len(m.Streams) || restored.Messages != summary.Messages {
		t.Errorf("restore summary %s: %v; backed up %d streams, %d messages", oneLine(stdout), err, len(m.Streams), summary.Messages)
	}
	if !strings.Contains(stderr, "restored") {
		t.Errorf("restore progress: %s", stderr)
	}
	t.Logf("restore in %v: %d streams, %d messages", time.Since(start).Round(time.Millisecond), restored.Streams, restored.Messages)
	if _, stderr, code := chimeCLI(t, natsAddr, "restore", "--from", out, "--data-dir", dataDir); code == 0 || !strings.Contains(stderr, "already exist") {
		t.Errorf("restore again: exit %d: %s", code, stderr)
	}

	// Every message of every stream backed up is back, chime stopped.
	after := offlineDump(t, dataDir)
	var keys, msgs int
	for _, s := range m.Streams {
		b, a := before[s.Stream], after[s.Stream]
		if !slices.Equal(b.msgs, a.msgs) || b.lastSeq != a.lastSeq {
			t.Errorf("%s: before %d messages to %d, restored %d to %d\nbefore: %v\nafter: %v", s.Stream, len(b.msgs), b.lastSeq, len(a.msgs), a.lastSeq, b.msgs, a.msgs)
		}
		msgs += len(a.msgs)
		if s.Kind == engine.KindBucket {
			keys += len(a.msgs)
		}
	}
	t.Logf("compared %d streams, %d messages (%d KV entries), equal", len(m.Streams), msgs, keys)

	// chime starts on it: the timers with their next fires, the
	// notifications, and timers fire.
	startServe(t, "bk2", env...)
	afterTimers := listTimers(t, natsAddr, agent)
	if !slices.EqualFunc(beforeTimers, afterTimers, func(a, b timers.Timer) bool {
		return a.ID == b.ID && a.NextFireAt != nil && b.NextFireAt != nil && a.NextFireAt.Equal(*b.NextFireAt) && a.Status == b.Status && a.Summary == b.Summary
	}) {
		t.Errorf("timers before %+v, after %+v", beforeTimers, afterTimers)
	}
	if notes := run("notify", "list", "--agent", agent); notes != beforeNotes {
		t.Errorf("notifications before %s, after %s", beforeNotes, notes)
	}
	soon := cliTimer(t, natsAddr, "timer", "create", "--after-ms", "300", "--summary", "after the restore", "--agent", agent)
	nc, err = nats.Connect("nats://" + natsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	eventually(t, 15*time.Second, "a timer fires after the restore", func() bool {
		for _, d := range inbox(t, nc) {
			if d.data.TimerID == soon.ID {
				return true
			}
		}
		return false
	})
}

// listTimers is the agent's timers, by ID.
func listTimers(t *testing.T, natsAddr, agent string) []timers.Timer {
	t.Helper()
	out, errOut, code := chimeCLI(t, natsAddr, "timer", "list", "--all", "--json", "--agent", agent)
	var list timers.ListTimersReply
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil {
		t.Fatalf("timer list: exit %d: %s %s", code, out, errOut)
	}
	slices.SortFunc(list.Timers, func(a, b timers.Timer) int { return strings.Compare(a.ID, b.ID) })
	return list.Timers
}

// streamDump is a stream's messages, each as subject, headers and data
// (a KV entry: its key, its operation and TTL, its value; its sequence is
// its revision), and its last sequence.
type streamDump struct {
	msgs    []string
	lastSeq uint64
}

func dumpStreams(t *testing.T, nc *nats.Conn) map[string]streamDump {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out := map[string]streamDump{}
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		st := s.CachedInfo().State
		d := streamDump{lastSeq: st.LastSeq}
		for seq := st.FirstSeq; st.Msgs > 0 && seq <= st.LastSeq; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if err != nil {
				continue // deleted
			}
			h, _ := json.Marshal(m.Header)
			d.msgs = append(d.msgs, fmt.Sprintf("%d %s %s %q", seq, m.Subject, h, m.Data))
		}
		out[name] = d
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// offlineDump reads the streams of a data dir with an embedded server of
// its own, chime stopped.
func offlineDump(t *testing.T, dataDir string) map[string]streamDump {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ns, err := engine.StartEmbedded(ctx, engine.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: dataDir}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	return dumpStreams(t, nc)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// TestBackupWithAuth: with NATS authorization on the embedded server, an
// operator's token may not use the JetStream API and the backup says what
// to do instead; chime stopped, the backup and restore on its data dir
// work, and chime starts on what was restored with its agents' records.
func TestBackupWithAuth(t *testing.T) {
	natsAddr, op, env := authedEnv(t)
	var dataDir string
	for _, e := range env {
		if d, ok := strings.CutPrefix(e, "CHIME_DATA_DIR="); ok {
			dataDir = d
		}
	}
	p := startServe(t, "bka", env...)
	tm := cliTimer(t, natsAddr, "timer", "create", "--after-ms", "3600000", "--agent", "bka", "--token", op)
	out := filepath.Join(t.TempDir(), "backup")
	if _, stderr, code := chimeCLI(t, natsAddr, "backup", "--out", out, "--token", op); code == 0 || !strings.Contains(stderr, "may not use the JetStream API") {
		t.Errorf("backup with an operator token: exit %d: %s", code, stderr)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
		p.exited <- nil
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not exit within 20s of SIGTERM")
	}
	if _, stderr, code := chimeCLI(t, natsAddr, "backup", "--out", out, "--data-dir", dataDir); code != 0 {
		t.Fatalf("backup of the data dir: exit %d: %s", code, stderr)
	}
	if err := os.RemoveAll(dataDir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := chimeCLI(t, natsAddr, "restore", "--from", out, "--data-dir", dataDir); code != 0 {
		t.Fatalf("restore into the data dir: exit %d: %s", code, stderr)
	}
	startServe(t, "bka2", env...)
	got := cliTimer(t, natsAddr, "timer", "get", tm.ID, "--agent", "bka", "--token", op)
	if got.NextFireAt == nil || tm.NextFireAt == nil || !got.NextFireAt.Equal(*tm.NextFireAt) {
		t.Errorf("timer after the restore: %+v, before %+v", got, tm)
	}
}
