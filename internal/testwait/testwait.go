// Package testwait waits, in tests, for a state that a real server or
// goroutine reaches in its own time: it polls a condition instead of
// sleeping for a guessed while, so a test goes on as soon as the state is
// there and fails with what it was waiting for when it never comes.
package testwait

import (
	"fmt"
	"testing"
	"time"
)

// poll is how often a condition is asked again, at most: often enough
// that a test waits little past the state, rarely enough not to load the
// server it asks.
const poll = 20 * time.Millisecond

// Eventually waits until cond holds, asking it at once and then every
// few milliseconds, and fails t if it does not within timeout. msg, if
// given, says what was awaited: a format and its arguments.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, msg ...any) {
	t.Helper()
	Until(t, timeout, func() (bool, string) { return cond(), "" }, msg...)
}

// Until is Eventually with a condition that says why it does not hold
// yet; the last reason is in the failure.
func Until(t testing.TB, timeout time.Duration, cond func() (bool, string), msg ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for wait := time.Millisecond; ; wait = min(2*wait, poll) {
		ok, why := cond()
		if ok {
			return
		}
		if !time.Now().Before(deadline) {
			if why != "" {
				why = "; last: " + why
			}
			t.Fatalf("%s: not within %v%s", describe(msg), timeout, why)
			return
		}
		time.Sleep(min(wait, time.Until(deadline)))
	}
}

func describe(msg []any) string {
	if len(msg) == 0 {
		return "condition"
	}
	if format, ok := msg[0].(string); ok {
		return fmt.Sprintf(format, msg[1:]...)
	}
	return fmt.Sprint(msg...)
}
