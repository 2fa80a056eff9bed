package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chime-nats/chime/bench"
	"github.com/chime-nats/chime/internal/netns"
)

// TestBenchChaosPartition runs a short `chime-bench chaos --partition`: a
// cluster of three nats-servers and two replicas, each in a network
// namespace of its own, under load; the server leading KV_chime_timers is
// cut off for 8 s. Its JSON must count nothing lost or duplicated and no
// cadence tick not covered, and the partition must have happened. How late fires were is the long run's to report. It
// needs root and iproute2's ip: without them it skips, but fails where CI
// is set, since CI runs as root and must not pass by skipping it.
func TestBenchChaosPartition(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	needNetns(ctx, t)
	args := []string{"chaos", "--servers", "3", "--replicas", "2", "--duration", "12s", "--every", "2s", "--down", "8s",
		"--partition", "timers-leader", "--rate", "30", "--repeating", "20", "--wait-rate", "3", "--grace", "3s", "--json"}
	cmd := exec.CommandContext(ctx, benchBinary, args...)
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "CHIME_") })
	// SIGINT first on the deadline: the run must get to delete its lab.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 20 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	begin := time.Now()
	runErr := cmd.Run()
	t.Logf("chime-bench %s: %v, exit %v\n%s", strings.Join(args, " "), time.Since(begin).Round(time.Millisecond), runErr, stderr.String())
	var exit *exec.ExitError
	if runErr != nil && !errors.As(runErr, &exit) {
		t.Fatalf("chime-bench chaos: %v", runErr)
	}
	var res bench.ChaosResult
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("chime-bench chaos printed %q: %v", stdout.String(), err)
	}
	var text bytes.Buffer
	res.WriteText(&text)
	t.Logf("result:\n%s", text.String())
	if res.Lost != 0 || res.Duplicated != 0 || !res.OK {
		t.Errorf("lost %d, duplicated %d (timers %+v, waits %+v)", res.Lost, res.Duplicated, res.Timers, res.Waits)
	}
	if res.Timers.TicksNotCovered != 0 {
		t.Errorf("%d of %d cadence ticks not covered by a catch-up fire", res.Timers.TicksNotCovered, res.Timers.CadenceTicks)
	}
	if runErr != nil {
		t.Errorf("exit: %v, with ok=%t", runErr, res.OK)
	}
	if res.PartitionsByKind[bench.PartitionTimersLeader] != 1 || len(res.KillsByKind) != 0 {
		t.Errorf("partitions %v, kills %v: want one timers-leader partition, no kill", res.PartitionsByKind, res.KillsByKind)
	}
	for _, k := range res.Kills {
		if k.Partition == nil || k.Partition.Addr == "" {
			t.Errorf("partition %d of %s: no partition figures or address: %+v", k.N, k.Target, k.Partition)
		}
	}
	if res.Timers.Expected == 0 || res.Waits.Created == 0 {
		t.Errorf("the run did too little: timers %+v, waits %+v", res.Timers, res.Waits)
	}
}

// needNetns skips without network namespaces, but fails where CI is set:
// CI runs as root, and must not pass by skipping.
func needNetns(ctx context.Context, t *testing.T) {
	t.Helper()
	if err := netns.Available(ctx); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set, and network namespaces are not available: %v", err)
		}
		t.Skipf("network namespaces not available: %v", err)
	}
}

// TestBenchChaosPartitionSIGTERM ends a partition run with SIGTERM while
// a server is cut off: the run must exit and leave none of its network
// namespaces or links behind.
func TestBenchChaosPartitionSIGTERM(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	needNetns(ctx, t)
	cmd := exec.CommandContext(ctx, benchBinary, "chaos", "--servers", "3", "--replicas", "1", "--duration", "60s", "--every", "1s",
		"--down", "30s", "--partition", "node", "--rate", "10", "--repeating", "5", "--json")
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "CHIME_") })
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	prefix := fmt.Sprintf("chp%d", cmd.Process.Pid)
	var log bytes.Buffer
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		log.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), "load for") {
			break
		}
	}
	// The partition is cut at 1 s into the load and lasts 30 s.
	time.Sleep(3 * time.Second)
	if left := labNames(t, prefix); len(left) == 0 {
		t.Errorf("no namespace or link named %s* during the run:\n%s", prefix, log.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(&log, stderr)
	err = cmd.Wait()
	t.Logf("exit %v after SIGTERM:\n%s", err, log.String())
	if ctx.Err() != nil {
		t.Fatal("the run did not exit within a minute of its start")
	}
	if left := labNames(t, prefix); len(left) > 0 {
		t.Errorf("left after SIGTERM: %v", left)
	}
}

// labNames lists the namespaces and links whose name starts with prefix.
func labNames(t *testing.T, prefix string) []string {
	t.Helper()
	ip, err := exec.LookPath("ip")
	if err != nil {
		ip = "/usr/sbin/ip"
	}
	var left []string
	for _, args := range [][]string{{"netns", "list"}, {"-o", "link", "show"}} {
		out, err := exec.Command(ip, args...).Output()
		if err != nil {
			t.Fatalf("ip %v: %v", args, err)
		}
		for _, f := range strings.Fields(string(out)) {
			if strings.HasPrefix(f, prefix) {
				left = append(left, f)
			}
		}
	}
	return left
}
