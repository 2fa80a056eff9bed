package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chime-nats/chime/bench"
)

// runBench runs `chime-bench ... --json` with its own embedded server and
// decodes the one JSON object it prints. Only correctness is checked here:
// the figures belong in benchmarks' notes, not in assertions.
func runBench(t *testing.T, out any, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, benchBinary, append(args, "--json")...)
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "CHIME_NATS_URL=") })
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chime-bench %v: %v: %s", args, err, stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		t.Fatalf("chime-bench %v printed %q: %v", args, stdout.String(), err)
	}
}

func TestBenchCommands(t *testing.T) {
	var timers bench.TimersResult
	runBench(t, &timers, "timers", "-n", "300", "-c", "4", "--lead", "1s", "--spread", "500ms")
	if timers.N != 300 || timers.Missed != 0 || timers.Duplicates != 0 || timers.CreatesPerS <= 0 || timers.PeakRSSBytes <= 0 {
		t.Errorf("bench timers: %+v", timers)
	}
	var waits bench.WaitsResult
	runBench(t, &waits, "waits", "-n", "200", "--agents", "10", "--lead", "3s", "--spread", "1s", "--timers", "50")
	if waits.N != 200 || waits.Missed != 0 || waits.Duplicates != 0 || waits.ProgressPerS <= 0 || waits.RequestsPerS <= 0 {
		t.Errorf("bench waits: %+v", waits)
	}
	var callbacks bench.CallbacksResult
	runBench(t, &callbacks, "callbacks", "-n", "300", "-c", "8", "--wakes", "20")
	if callbacks.N != 300 || callbacks.Errors != 0 || callbacks.Delivered != 300 || callbacks.Missed != 0 || callbacks.RequestsPerS <= 0 || callbacks.WakeToInboxMs.Max <= 0 {
		t.Errorf("bench callbacks: %+v", callbacks)
	}
	for _, tr := range []*bench.TimersResult{waits.TimersAlone, waits.TimersWithWaits} {
		if tr == nil || tr.N != 50 || tr.Missed != 0 || tr.Duplicates != 0 {
			t.Errorf("bench waits, timers: %+v", tr)
		}
	}
}
