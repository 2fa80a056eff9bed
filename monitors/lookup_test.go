package monitors_test

import (
	"context"
	"errors"
	"testing"

	"github.com/chime-nats/chime/monitors"
)

// TestFinished: WaitFor's question of a monitor: running, stopped with its
// reason, and unknown (another agent's too) as monitor_not_found.
func TestFinished(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	m := start(t, e, "a1", `{"description":"CI","command":"make"}`)
	if stopped, reason, err := e.store.Finished(ctx, "a1", m.ID); err != nil || stopped || reason != "" {
		t.Fatalf("running: %v %q %v", stopped, reason, err)
	}
	if _, err := e.store.Stop(ctx, "a1", &monitors.StopRequest{MonitorID: m.ID}); err != nil {
		t.Fatal(err)
	}
	if stopped, reason, err := e.store.Finished(ctx, "a1", m.ID); err != nil || !stopped || reason != monitors.ReasonStopped {
		t.Fatalf("stopped: %v %q %v", stopped, reason, err)
	}
	for _, agent := range []string{"a1", "a2"} {
		id := "nope"
		if agent == "a2" {
			id = m.ID
		}
		if _, _, err := e.store.Finished(ctx, agent, id); !errors.Is(err, monitors.ErrMonitorNotFound) {
			t.Fatalf("%s's %s: %v", agent, id, err)
		}
	}
}
