package bench

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// chimeBinary builds cmd/chime for the replicas the runs start.
func chimeBinary(t *testing.T) string {
	t.Helper()
	exe := filepath.Join(t.TempDir(), "chime")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "build", "-o", exe, "github.com/chime-nats/chime/cmd/chime").CombinedOutput()
	if err != nil {
		t.Fatalf("go build cmd/chime: %v\n%s", err, out)
	}
	return exe
}

// TestScaleAndCapacity runs both with tiny numbers on a standalone server:
// they must start, measure, print and stop. The figures are not checked.
func TestScaleAndCapacity(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nats-server and chime processes")
	}
	exe := chimeBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var progress bytes.Buffer

	profiles := t.TempDir()
	sc, err := Scale(ctx, ScaleOptions{Servers: 1, Replicas: []int{1}, N: 200, Agents: 10, Clients: 8, Lead: 2 * time.Second, Exe: exe, Progress: &progress,
		ProfileDir: profiles, ProfileSeconds: 1})
	if err != nil {
		t.Fatalf("Scale: %v\n%s", err, progress.String())
	}
	var text bytes.Buffer
	sc.WriteText(&text)
	t.Logf("%s", text.String())
	r := sc.Runs[0]
	if len(sc.Runs) != 1 || r.Missed != 0 || r.Duplicates != 0 || r.CreatesPerS <= 0 || r.FiresPerS <= 0 || len(r.CPU) != 4 || r.Applied < 200 {
		t.Errorf("scale: %+v", sc.Runs)
	}
	// One replica receives every create once: its watch delivers each.
	if len(r.Changes) != 1 || r.Changes[0].Changes != 200 || r.Changes[0].PerCreate != 1 {
		t.Errorf("scale: changes %+v, want r1 with 200 (1 per create)", r.Changes)
	}
	for _, phase := range []string{"create", "fire"} {
		// A CPU profile is gzipped protobuf: it starts with gzip's magic.
		b, err := os.ReadFile(filepath.Join(profiles, "scale-s1-r1-"+phase+"-r1.pprof"))
		if err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Errorf("%s profile of r1 from CHIME_PPROF_ADDR: %d bytes, %v", phase, len(b), err)
		}
	}

	ca, err := Capacity(ctx, CapacityOptions{Servers: 1, Replicas: []int{2}, Timers: 300, Agents: 10, Clients: 8,
		Stable: 500 * time.Millisecond, Takeover: 3 * time.Second, Exe: exe, Progress: &progress})
	if err != nil {
		t.Fatalf("Capacity: %v\n%s", err, progress.String())
	}
	text.Reset()
	ca.WriteText(&text)
	t.Logf("%s", text.String())
	c := ca.Runs[0]
	if !c.Settled || c.HeldSum != 300 || len(c.PerReplica) != 2 || c.TakeoverKill == nil || c.PerReplica[0].IdleRSSBytes <= 0 || c.PerReplica[0].HeapBytes <= 0 {
		t.Errorf("capacity: %+v", c)
	}
}

func TestParseMetrics(t *testing.T) {
	m, err := parseMetrics(strings.NewReader(`# HELP chime_timers_active Active timers.
# TYPE chime_timers_active gauge
chime_timers_active 42
process_resident_memory_bytes 2.5e+07
chime_shard_load_seconds_bucket{le="0.1"} 3
chime_shard_load_seconds_sum 0.25
chime_shard_load_seconds_count 3
chime_requests_total{endpoint="nats:timer.create",outcome="ok"} 10 1700000000000
chime_requests_total{endpoint="a b}",outcome="invalid"} 2
`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"chime_timers_active": 42, "process_resident_memory_bytes": 25e6,
		"chime_shard_load_seconds_sum": 0.25, "chime_shard_load_seconds_count": 3, "chime_requests_total": 12}
	if len(m) != len(want) {
		t.Errorf("got %v, want %v", m, want)
	}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %v, want %v", k, m[k], v)
		}
	}
}

func TestProcCPU(t *testing.T) {
	// Burn a little CPU so that this process has some to read.
	for end := time.Now().Add(30 * time.Millisecond); time.Now().Before(end); {
	}
	if d := procCPU(os.Getpid()); d <= 0 {
		t.Errorf("procCPU(self) = %v", d)
	}
	if d := procCPU(0); d != 0 {
		t.Errorf("procCPU(0) = %v", d)
	}
}
