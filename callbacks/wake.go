package callbacks

import (
	"time"

	"github.com/chime-nats/chime/agents"
)

// StaleClaim is how long a wake may stay in flight (claimed, not yet in
// the inbox) before a new wake stops folding into it: the claimer crashed
// or its event was a duplicate.
const StaleClaim = 30 * time.Second

// WakeConsumed reports whether the agent has acked the pending hint, given
// its inbox consumer's ack floor; a hint still in flight to the inbox
// (InboxSeq not yet recorded) is pending until its claim is stale.
func WakeConsumed(pw *agents.PendingWake, ackFloor uint64, now time.Time) bool {
	if pw.InboxSeq == 0 {
		return now.Sub(pw.ClaimedAt) > StaleClaim
	}
	return ackFloor >= pw.InboxSeq
}
