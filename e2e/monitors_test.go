package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/monitors"
	"github.com/chime-nats/chime/partitions"
	"github.com/chime-nats/chime/subjects"
)

// monitorEnvelopes returns the monitor deliveries of kind in the inbox stream.
func monitorEnvelopes(t *testing.T, nc *nats.Conn, kind string) []subjects.Envelope {
	t.Helper()
	var out []subjects.Envelope
	for _, d := range inbox(t, nc) {
		if d.env.Kind == kind {
			out = append(out, d.env)
		}
	}
	return out
}

// TestCLIMonitorRun: the built binary runs a command as a monitor's
// source: its matching stdout lines reach the inbox as monitor_event, the
// rest are filtered, and its exit code ends the monitor (source_ended);
// a monitor.stop from elsewhere stops a command that would run on.
func TestCLIMonitorRun(t *testing.T) {
	natsAddr := freeAddr(t)
	startServe(t, "monitors", "CHIME_DATA_DIR="+t.TempDir(), "CHIME_NATS_LISTEN="+natsAddr)
	nc, err := nats.Connect("nats://" + natsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	out, errOut, code := chimeCLI(t, natsAddr, "monitor", "run", "--agent", "cli", "--id", "m1", "--description", "counter", "--match", "^line",
		"--", "sh", "-c", "for i in 1 2 3; do echo line $i; echo noise; done; exit 4")
	if code != 0 {
		t.Fatalf("monitor run: exit %d: %s", code, errOut)
	}
	outLines := strings.Split(strings.TrimSpace(out), "\n")
	if len(outLines) != 2 || outLines[0] != `{"monitor_id":"m1"}` {
		t.Fatalf("output %q", out)
	}
	var final monitors.Monitor
	if err := json.Unmarshal([]byte(outLines[1]), &final); err != nil {
		t.Fatal(err)
	}
	if final.StopReason != monitors.ReasonSourceEnded || final.ExitCode == nil || *final.ExitCode != 4 || final.Events != 3 || final.Filtered != 3 ||
		final.Source.Value != `sh -c "for i in 1 2 3; do echo line $i; echo noise; done; exit 4"` {
		t.Fatalf("final record: %+v", final)
	}
	var got []string
	for _, env := range monitorEnvelopes(t, nc, subjects.KindMonitorEvent) {
		var d monitors.EventData
		if err := json.Unmarshal(env.Data, &d); err != nil {
			t.Fatal(err)
		}
		if env.Source.ID != "m1" || d.Description != "counter" || env.Trust != subjects.TrustExternal {
			t.Fatalf("event %+v", env)
		}
		got = append(got, d.Lines...)
	}
	if strings.Join(got, "|") != "line 1|line 2|line 3" {
		t.Fatalf("lines delivered: %q", got)
	}
	stops := monitorEnvelopes(t, nc, subjects.KindMonitorStopped)
	if len(stops) != 1 || !strings.Contains(stops[0].Text, "its source ended with exit code 4") {
		t.Fatalf("monitor_stopped: %+v", stops)
	}

	// A command that cannot start ends its monitor as a shell would say.
	out, errOut, code = chimeCLI(t, natsAddr, "monitor", "run", "--agent", "cli", "--id", "m0", "--", "/nonexistent/cmd")
	if code != 0 || !strings.Contains(out, `"stop_reason":"source_ended"`) || !strings.Contains(out, `"exit_code":127`) {
		t.Fatalf("a command that cannot start: exit %d: %s %s", code, out, errOut)
	}
	// Bad input is refused before anything starts.
	if out, errOut, code = chimeCLI(t, natsAddr, "monitor", "run", "--agent", "cli", "--persistent", "--timeout-ms", "5000", "--", "true"); code == 0 ||
		!strings.Contains(errOut, "timeout_ms and persistent are exclusive") || out != "" {
		t.Fatalf("bad input: exit %d: %q %q", code, out, errOut)
	}

	// A command that would print for a minute, stopped by monitor.stop.
	cmd := exec.Command(binary, "monitor", "run", "--agent", "cli", "--id", "m2", "--description", "ticker",
		"--", "sh", "-c", "while true; do echo tick; sleep 0.1; done")
	cmd.Env = append(os.Environ(), "CHIME_NATS_URL=nats://"+natsAddr)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != `{"monitor_id":"m2"}` {
		t.Fatalf("first line %q", lines.Text())
	}
	testwait.Eventually(t, 10*time.Second, func() bool {
		return len(monitorEnvelopes(t, nc, subjects.KindMonitorEvent)) > 3
	}, "the ticker's events")
	msg, err := nc.Request(subjects.Agent("cli", monitors.ActionStop), []byte(`{"monitor_id":"m2"}`), 5*time.Second)
	if err != nil || strings.Contains(string(msg.Data), `"error"`) {
		t.Fatalf("stop: %v %s", err, msg.Data)
	}
	var last string
	for lines.Scan() {
		last = lines.Text()
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("monitor run after a stop: %v", err)
	}
	var stopped monitors.Monitor
	if err := json.Unmarshal([]byte(last), &stopped); err != nil || stopped.ID != "m2" || stopped.StopReason != monitors.ReasonStopped {
		t.Fatalf("final record %q: %v", last, err)
	}
	if stops := monitorEnvelopes(t, nc, subjects.KindMonitorStopped); len(stops) != 3 || stops[2].ID != "monitor_m2_stopped" {
		t.Fatalf("monitor_stopped: %+v", stops)
	}
}

// TestSubjectMonitorMovesWithItsShard: two replicas; a subject monitor
// is watched by the replica holding its shard; SIGKILLed, that replica's
// shard moves to the other, which resumes the watch from the record's
// next seq: what is published then still reaches the inbox, and no batch
// is stored twice.
func TestSubjectMonitorMovesWithItsShard(t *testing.T) {
	ns := natstest.Server(t)
	procs := map[string]*proc{}
	for _, id := range []string{"r0", "r1"} {
		procs[id] = startServe(t, id, "CHIME_NATS_URL="+ns.ClientURL(), "CHIME_MONITOR_SUBJECTS=ci.>")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
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
	msg, err := nc.Request(subjects.Agent("mon", monitors.ActionStart), []byte(`{"description":"ci","subject":"ci.>","persistent":true}`), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var m monitors.Monitor
	if err := json.Unmarshal(msg.Data, &m); err != nil || m.ID == "" {
		t.Fatalf("start: %s %v", msg.Data, err)
	}
	owners := shardOwners(ctx, leases)
	holder := owners[partitions.ShardOf(monitors.Key("mon", m.ID), len(owners))]
	n := 0
	publishUntilSeen := func(what string) {
		t.Helper()
		var sent []string
		eventually(t, 30*time.Second, what, func() bool {
			n++
			line := fmt.Sprintf("build %d", n)
			if err := nc.Publish("ci.status", []byte(line)); err != nil {
				t.Fatal(err)
			}
			_ = nc.Flush()
			sent = append(sent, "ci.status "+line)
			for _, env := range monitorEnvelopes(t, nc, subjects.KindMonitorEvent) {
				var d monitors.EventData
				if err := json.Unmarshal(env.Data, &d); err != nil {
					t.Fatal(err)
				}
				for _, l := range d.Lines {
					if slices.Contains(sent, l) {
						return true
					}
				}
			}
			return false
		})
	}
	publishUntilSeen("an event watched by " + holder)
	procs[holder].kill()
	publishUntilSeen("an event after " + holder + " was killed")
	ids := map[string]bool{}
	for _, env := range monitorEnvelopes(t, nc, subjects.KindMonitorEvent) {
		if ids[env.ID] {
			t.Fatalf("envelope %s stored twice", env.ID)
		}
		ids[env.ID] = true
	}
	owners = shardOwners(ctx, leases)
	if now := owners[partitions.ShardOf(monitors.Key("mon", m.ID), len(owners))]; now == holder || now == "" {
		t.Fatalf("the shard is held by %q after %s's death", now, holder)
	}
}
