package scheduler

import (
	"fmt"
	"sync"
	"time"
)

// health follows whether fire publishes go through. A run of failures
// makes the replica unhealthy: it gives its shards away (Leases) and says
// not ready, instead of holding shards it cannot fire. Once nothing has
// failed for failQuiet it is healthy again and takes shards back; if the
// engine is still broken the next attempts fail and it steps back again.
type health struct {
	now func() time.Time

	mu       sync.Mutex
	streak   int
	lastFail time.Time
	lastErr  string
}

const (
	failStreak = 3
	// failQuiet is short: after a leader election every replica has been
	// failing, and the sooner they take their shards back the sooner the
	// backlog fires.
	failQuiet = time.Second
)

func (h *health) success() {
	h.mu.Lock()
	h.streak = 0
	h.mu.Unlock()
}

func (h *health) failure(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.streak++
	h.lastFail = h.now()
	h.lastErr = err.Error()
}

func (h *health) ok() (bool, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.streak >= failStreak && h.now().Sub(h.lastFail) < failQuiet {
		return false, fmt.Sprintf("%d fire publishes failed in a row (last: %s)", h.streak, h.lastErr)
	}
	return true, ""
}
