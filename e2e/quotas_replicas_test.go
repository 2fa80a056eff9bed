package e2e_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/subjects"
)

// TestQuotaAcrossReplicas: two replicas split an agent's timers between
// their shards, neither holding them all, yet each counts all of them: at
// the quota every create is refused, whichever replica answers, and a
// cancel makes room again.
func TestQuotaAcrossReplicas(t *testing.T) {
	ns := natstest.Server(t)
	env := []string{"CHIME_NATS_URL=" + ns.ClientURL(), "CHIME_MAX_TIMERS_PER_AGENT=40"}
	procs := []*proc{startServe(t, "q0", env...), startServe(t, "q1", env...)}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	held := func() (a, b float64) {
		return procs[0].metric(t, "chime_timers_active"), procs[1].metric(t, "chime_timers_active")
	}
	eventually(t, 15*time.Second, "both replicas hold shards", func() bool {
		return procs[0].metric(t, "chime_shards_held") > 0 && procs[1].metric(t, "chime_shards_held") > 0
	})

	c, _ := client.New(nc, "counted")
	var ids []string
	for range 40 {
		tm, err := c.CreateTimer(ctx, time.Hour.Milliseconds(), 0, "")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, tm.ID)
	}
	eventually(t, 10*time.Second, "the 40 timers held between the two", func() bool { a, b := held(); return a+b == 40 })
	if a, b := held(); a == 0 || b == 0 {
		t.Fatalf("one replica holds all 40 (%v and %v): the test needs them split", a, b)
	}
	for range 20 {
		_, err := c.CreateTimer(ctx, time.Hour.Milliseconds(), 0, "")
		var e *subjects.Error
		if !errors.As(err, &e) || e.Code != subjects.CodeQuotaExceeded {
			t.Fatalf("create over the quota: %v, want quota_exceeded", err)
		}
	}
	if _, err := c.CancelTimer(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the cancel seen", func() bool { a, b := held(); return a+b == 39 })
	if _, err := c.CreateTimer(ctx, time.Hour.Milliseconds(), 0, ""); err != nil {
		t.Fatalf("create after a cancel made room: %v", err)
	}
	var served float64
	for _, p := range procs {
		served += p.metric(t, `chime_quota_refusals_total{quota="timers"}`)
	}
	if served != 20 {
		t.Fatalf("the replicas counted %v timer quota refusals, want 20", served)
	}
	// The queue group spreads the 20 at random: all on one replica is a
	// chance of 2 in a million.
	for _, p := range procs {
		if p.metric(t, `chime_quota_refusals_total{quota="timers"}`) == 0 {
			t.Errorf("replica %s refused none of the 20: it was not shown to count the other's shards", p.id)
		}
	}
}
