package callbacks

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/chime-nats/chime/agents"
)

// TestWakeClaimGoesStale: a wake claimed but not yet in the inbox stays
// pending for StaleClaim, then stops holding new wakes back; once in the
// inbox, only the agent's ack ends it, however long that takes.
func TestWakeClaimGoesStale(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pw := &agents.PendingWake{ClaimedAt: time.Now()}
		if WakeConsumed(pw, 100, time.Now()) {
			t.Fatal("a claim in flight is consumed by an ack floor that cannot be its")
		}
		time.Sleep(StaleClaim)
		if WakeConsumed(pw, 0, time.Now()) {
			t.Fatal("a claim is stale at StaleClaim, not after it")
		}
		time.Sleep(time.Millisecond)
		if !WakeConsumed(pw, 0, time.Now()) {
			t.Fatalf("a claim %v old is still pending", time.Since(pw.ClaimedAt))
		}
		pw.InboxSeq = 7
		time.Sleep(time.Hour)
		if WakeConsumed(pw, 6, time.Now()) {
			t.Fatal("a hint in the inbox consumed before the ack floor reached it")
		}
		if !WakeConsumed(pw, 7, time.Now()) {
			t.Fatal("a hint acked is still pending")
		}
	})
}
