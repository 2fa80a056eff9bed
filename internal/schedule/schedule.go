// Package schedule builds the engine's message schedules (nats-server
// 2.12+), which tasks and WaitFor use for their one-off deadlines. It sits
// apart from engine so that features (which the public client links for
// their wire types) do not link nats-server.
package schedule

import (
	"time"

	"github.com/nats-io/nats.go"
)

// At is a message schedule: stored on subject in a stream that allows
// schedules, it makes the engine publish its body to target at at, once,
// and is then removed. A later schedule on the same subject replaces it.
func At(subject, target string, at time.Time) *nats.Msg {
	m := &nats.Msg{Subject: subject, Header: nats.Header{}}
	m.Header.Set("Nats-Schedule", "@at "+at.UTC().Format(time.RFC3339Nano))
	m.Header.Set("Nats-Schedule-Target", target)
	return m
}
