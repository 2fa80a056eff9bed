package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chime-nats/chime/bench"
)

// TestBenchChaos runs a short `chime-bench chaos`: its own standalone
// nats-server and two replicas of the built chime beside it, under load, a replica
// and then the server SIGKILLed and restarted. Its JSON must count nothing
// lost or duplicated, no cadence tick (of its interval timers and of its
// calendar timers) not covered by a catch-up fire, no calendar time
// stored twice, and it must exit 0. Lateness is the long run's to
// report, not an assertion here.
func TestBenchChaos(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := []string{"chaos", "--servers", "1", "--replicas", "2", "--duration", "8s", "--every", "3s",
		"--rate", "50", "--calendar", "5", "--kill", "replica,server", "--json"}
	cmd := exec.CommandContext(ctx, benchBinary, args...)
	// The run starts its own NATS and replicas: none of the caller's settings.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "CHIME_") })
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
	if res.Timers.Calendar != 5 || res.Timers.CalendarTicksNotCovered != 0 || res.Timers.CalendarTimesTwice != 0 {
		t.Errorf("calendar timers: %d; %d of %d scheduled times not covered by a catch-up fire, %d stored twice",
			res.Timers.Calendar, res.Timers.CalendarTicksNotCovered, res.Timers.CalendarTicks, res.Timers.CalendarTimesTwice)
	}
	if runErr != nil {
		t.Errorf("exit: %v, with ok=%t", runErr, res.OK)
	}
	if res.Timers.Created == 0 || res.Timers.Expected == 0 || res.Waits.Created == 0 || res.KillsByKind["replica"] == 0 {
		t.Errorf("the run did too little: timers %+v, waits %+v, kills %v", res.Timers, res.Waits, res.KillsByKind)
	}
}
