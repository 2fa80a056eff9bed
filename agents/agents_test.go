package agents_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/internal/natstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestStore: an unknown agent has the zero state; pause and resume are
// idempotent; one feature's update keeps the others' fields.
func TestStore(t *testing.T) {
	ns := natstest.Server(t)
	_, res := natstest.Provisioned(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := agents.NewStore(res.Agents)

	st, rev, err := s.Get(ctx, "new")
	if err != nil || rev != 0 || st.AgentID != "new" || st.Status != "" || st.PausedAt != nil {
		t.Fatalf("unknown agent: %+v %d %v", st, rev, err)
	}
	if _, _, err := s.Update(ctx, "a", func(st *agents.AgentState) (bool, error) {
		st.Status = agents.AgentActive
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	for range 2 {
		if err := s.Pause(ctx, "a", at); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Pause(ctx, "a", at.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	st, _, _ = s.Get(ctx, "a")
	if st.Status != agents.AgentActive || st.PausedAt == nil || !st.PausedAt.Equal(at) {
		t.Fatalf("paused: %+v (a second pause must not move paused_at; the status must stay)", st)
	}
	for range 2 {
		if err := s.Resume(ctx, "a"); err != nil {
			t.Fatal(err)
		}
	}
	st, rev, _ = s.Get(ctx, "a")
	if st.PausedAt != nil || st.Status != agents.AgentActive {
		t.Fatalf("resumed: %+v", st)
	}
	// A change that writes nothing returns the revision read.
	if _, got, err := s.Update(ctx, "a", func(*agents.AgentState) (bool, error) { return false, nil }); err != nil || got != rev {
		t.Fatalf("no-op update: rev %d, want %d (%v)", got, rev, err)
	}
}

// TestInterventionCursorEpochs: the cursor moves forward within one events
// stream; a stream made anew (another epoch) starts it over; a cursor
// from before epochs counts as the current stream's.
func TestInterventionCursorEpochs(t *testing.T) {
	ns := natstest.Server(t)
	_, res := natstest.Provisioned(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := agents.NewStore(res.Agents)
	cursor := func(epoch int64) uint64 {
		st, _, err := s.Get(ctx, "iv")
		if err != nil {
			t.Fatal(err)
		}
		return agents.InterventionCursor(st, epoch)
	}
	// Before epochs: a bare cursor.
	if _, _, err := s.Update(ctx, "iv", func(st *agents.AgentState) (bool, error) { st.LastInterventionSeq = 100; return true, nil }); err != nil {
		t.Fatal(err)
	}
	if got := cursor(7); got != 100 {
		t.Fatalf("legacy cursor read as %d", got)
	}
	for _, step := range []struct {
		seq   uint64
		epoch int64
		want  uint64
	}{{90, 7, 100}, {120, 7, 120}, {110, 7, 120}, {3, 8, 3}, {5, 8, 5}} {
		if err := s.InterventionDone(ctx, "iv", step.seq, step.epoch); err != nil {
			t.Fatal(err)
		}
		if got := cursor(step.epoch); got != step.want {
			t.Fatalf("after %d in epoch %d: cursor %d, want %d", step.seq, step.epoch, got, step.want)
		}
	}
	if got := cursor(7); got != 0 {
		t.Fatalf("the old stream's cursor read in a new epoch as %d", got)
	}
}
