package e2e_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/waits"
)

// TestWaitSurvivesReplicaKill registers waits on two replicas, SIGKILLs the
// one firing half of them mid-wait, and checks every wait completes exactly
// once.
func TestWaitSurvivesReplicaKill(t *testing.T) {
	ns := natstest.Server(t)
	a := startServe(t, "wa", "CHIME_NATS_URL="+ns.ClientURL())
	b := startServe(t, "wb", "CHIME_NATS_URL="+ns.ClientURL())
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js, _ := jetstream.New(nc)
	leases, err := js.KeyValue(ctx, engine.LeasesBucket)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "shards shared", func() bool {
		owners := map[string]int{}
		for s := range 32 {
			if e, err := leases.Get(ctx, fmt.Sprintf("shard.%d", s)); err == nil {
				owners[string(e.Value())]++
			}
		}
		return owners["wa"] > 0 && owners["wb"] > 0 && owners["wa"]+owners["wb"] == 32
	})

	const n = 40
	c, _ := client.New(nc, "survivor")
	ids := map[string]bool{}
	for i := range n {
		var r waits.WaitReply
		if err := c.Request(ctx, waits.ActionWaitRequest, []byte(fmt.Sprintf(`{"seconds":%d}`, 3+i%2)), &r); err != nil {
			t.Fatal(err)
		}
		ids[r.WaitID] = true
	}
	time.Sleep(time.Second)
	a.kill()
	_ = b

	eventually(t, 15*time.Second, "every wait completed", func() bool {
		return len(waitEnds(t, nc, "survivor")) >= n
	})
	time.Sleep(500 * time.Millisecond) // let a duplicate show
	ends := waitEnds(t, nc, "survivor")
	seen := map[string]int{}
	for _, env := range ends {
		if env.Kind != subjects.KindWaitComplete || !strings.HasPrefix(env.Text, "Wait complete. Reached ") {
			t.Errorf("end %+v", env)
		}
		seen[env.Source.ID]++
	}
	for id := range ids {
		if seen[id] != 1 {
			t.Errorf("wait %s ended %d times", id, seen[id])
		}
	}
}

// waitEnds reads the wait deliveries stored in an agent's inbox.
func waitEnds(t *testing.T, nc *nats.Conn, agent string) []subjects.Envelope {
	t.Helper()
	var out []subjects.Envelope
	for _, d := range inbox(t, nc) {
		if d.env.AgentID == agent && d.env.Source.Type == "wait" {
			out = append(out, d.env)
		}
	}
	return out
}

// TestCLIWait runs `chime wait` from the built binary: a short wait (of
// fractional minutes) prints the completion text, and off a terminal no
// progress bar; Ctrl-C on a long one cancels it on the server.
func TestCLIWait(t *testing.T) {
	natsAddr := freeAddr(t)
	startServe(t, "cliwait", "CHIME_DATA_DIR="+t.TempDir(), "CHIME_NATS_LISTEN="+natsAddr)

	// Off a terminal no bar redraws its line: the start and the end only.
	out, errOut, code := chimeCLI(t, natsAddr, "wait", "--minutes", "0.04", "--agent", "term")
	if code != 0 || !strings.HasPrefix(out, "Wait complete. Reached ") || !strings.HasPrefix(errOut, "wait ") ||
		strings.Contains(errOut, "\r") || strings.Contains(errOut, "icon://") {
		t.Fatalf("chime wait --minutes 0.04: exit %d\nstdout %q\nstderr %q", code, out, errOut)
	}
	if _, errOut, code := chimeCLI(t, natsAddr, "wait", "--until", "yesterday", "--agent", "term"); code != 1 || !strings.Contains(errOut, "Invalid timestamp format: yesterday") {
		t.Errorf("bad --until: exit %d, %q", code, errOut)
	}
	if _, _, code := chimeCLI(t, natsAddr, "wait"); code != 2 {
		t.Errorf("wait without a target exits %d, want 2", code)
	}

	cmd := exec.Command(binary, "wait", "--minutes", "10", "--agent", "term")
	cmd.Env = append(os.Environ(), "CHIME_NATS_URL=nats://"+natsAddr)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewReader(stderr)
	first, err := lines.ReadString('\n') // "wait <id> until <target>"
	if err != nil {
		t.Fatal(err)
	}
	var waitID string
	if _, err := fmt.Sscanf(first, "wait %s until", &waitID); err != nil {
		t.Fatalf("first line %q: %v", first, err)
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	rest, _ := io.ReadAll(lines)
	_ = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 130 || !strings.Contains(string(rest), "wait "+waitID+" cancelled") {
		t.Fatalf("after Ctrl-C: exit %d, stderr %q", code, rest)
	}
	nc, err := nats.Connect("nats://" + natsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, _ := client.New(nc, "term")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w, err := c.CancelWait(ctx, waitID) // ended already: returns the record
	if err != nil || w.Status != waits.WaitCancelled || w.CancelledBy != waits.CancelByRequest {
		t.Fatalf("wait after Ctrl-C: %+v %v", w, err)
	}
}
