package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/timers"
)

// TestRestartAfterSIGKILL kills chime (embedded NATS and all) with SIGKILL
// while timers are pending, restarts it on the same data dir, and checks
// every timer fires exactly once, the overdue ones at once.
func TestRestartAfterSIGKILL(t *testing.T) {
	dataDir := t.TempDir()
	natsAddr := freeAddr(t)
	env := []string{"CHIME_DATA_DIR=" + dataDir, "CHIME_NATS_LISTEN=" + natsAddr}
	p := startServe(t, "solo", env...)

	nc, err := nats.Connect("nats://"+natsAddr, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, _ := client.New(nc, "restart")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var early, late []string
	for range 20 {
		tm, err := c.CreateTimer(ctx, 300, 0, "")
		if err != nil {
			t.Fatal(err)
		}
		early = append(early, tm.ID)
	}
	for i := range 50 {
		tm, err := c.CreateTimer(ctx, int64(1500+30*i), 0, "")
		if err != nil {
			t.Fatal(err)
		}
		late = append(late, tm.ID)
	}
	rep, err := c.CreateTimer(ctx, 1000, 500, "")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "early timers delivered", func() bool { return countInbox(t, nc) >= len(early) })

	p.kill()                    // SIGKILL: no drain, no lease hand-back
	time.Sleep(4 * time.Second) // every late timer is now overdue
	restarted := time.Now()
	startServe(t, "solo-again", env...)

	eventually(t, 15*time.Second, "all one-shots delivered after restart", func() bool {
		return countInbox(t, nc) >= len(early)+len(late)
	})
	time.Sleep(500 * time.Millisecond) // let any duplicate show up
	byTimer := map[string]int{}
	byID := map[string]int{}
	for _, d := range inbox(t, nc) {
		byTimer[d.env.Source.ID]++
		byID[d.env.ID]++
		if byID[d.env.ID] > 1 {
			t.Errorf("envelope %s stored twice", d.env.ID)
		}
		for _, id := range late {
			if id == d.env.Source.ID && d.data.DueAt.Before(restarted) && d.data.FiredAt.Sub(restarted) > 5*time.Second {
				t.Errorf("overdue timer %s fired %v after restart", id, d.data.FiredAt.Sub(restarted))
			}
		}
	}
	for _, id := range append(early, late...) {
		if byTimer[id] != 1 {
			t.Errorf("timer %s delivered %d times", id, byTimer[id])
		}
	}
	// The repeating timer fired once for its missed occurrences, then kept cadence.
	eventually(t, 10*time.Second, "repeating record caught up", func() bool {
		got, err := c.GetTimer(ctx, rep.ID)
		return err == nil && got.FireCount >= 2 && int(got.FireCount) == countByTimer(t, nc, rep.ID)
	})
	got, _ := c.GetTimer(ctx, rep.ID)
	if off := got.NextFireAt.Sub(*rep.NextFireAt); off%(500*time.Millisecond) != 0 {
		t.Errorf("next_fire_at off cadence by %v", off%(500*time.Millisecond))
	}
	if got.Status != timers.TimerActive {
		t.Errorf("repeating status %s", got.Status)
	}
}

func countByTimer(t *testing.T, nc *nats.Conn, timerID string) int {
	n := 0
	for _, d := range inbox(t, nc) {
		if d.env.Source.ID == timerID {
			n++
		}
	}
	return n
}
