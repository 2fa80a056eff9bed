package consumer

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Redelivery defaults of every durable consumer; see Redelivery.
const (
	// DefaultAckWait is the first delivery's ack deadline unless a consumer
	// sets its own: how long a message held by a dead replica waits before
	// another replica gets it.
	DefaultAckWait = 2 * time.Second
	// DefaultMaxDeliver bounds the deliveries of one message: with the
	// backoff below, about eight hours of retries. A message that keeps
	// failing is almost always one whose effects wait on the engine (a
	// stream without a leader, a server away): giving it up after minutes
	// would lose a wait's completion or an intervention to an outage.
	// Poison is terminated at once, whatever this says.
	DefaultMaxDeliver = 1000
)

// backoffSteps are the later redelivery steps; BackOff starts at the
// consumer's AckWait and continues with the steps above it.
// They start short: after a leader election (4-9 s) the backlog should go
// out within seconds, not at the next 15 s step.
var backoffSteps = []time.Duration{4 * time.Second, 8 * time.Second, 15 * time.Second, 30 * time.Second}

// Redelivery returns c with the delivery policy every pool consumer runs
// under, its AckWait, MaxDeliver and BackOff kept consistent:
//
//   - AckPolicy explicit; AckWait is c.AckWait (DefaultAckWait when unset)
//     and BackOff[0] equals it (the server takes BackOff[0] as AckWait);
//   - BackOff continues 4s, 8s, 15s, 30s (the steps above AckWait), so a message
//     that keeps failing is retried less and less often: the server adds
//     BackOff[n-1]-BackOff[0] to a Nak's delay after the n-th delivery;
//   - MaxDeliver is c.MaxDeliver (DefaultMaxDeliver when unset), and
//     BackOff is cut to at most MaxDeliver steps, as the server requires.
//
// AckWait may be shorter than a handler's timeout: the pool keeps a
// message it holds with m.InProgress() every third of AckWait, from the
// moment it is received until it is settled. So AckWait only bounds how
// long a dead replica's messages wait, never how long a handler may work.
func Redelivery(c jetstream.ConsumerConfig) jetstream.ConsumerConfig {
	c.AckPolicy = jetstream.AckExplicitPolicy
	if c.AckWait <= 0 {
		c.AckWait = DefaultAckWait
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = DefaultMaxDeliver
	}
	backoff := []time.Duration{c.AckWait}
	for _, d := range backoffSteps {
		if d > c.AckWait {
			backoff = append(backoff, d)
		}
	}
	if c.MaxDeliver > 0 && len(backoff) > c.MaxDeliver {
		backoff = backoff[:c.MaxDeliver]
	}
	c.BackOff = backoff
	return c
}
