package timers

import (
	"time"

	"github.com/chime-nats/chime/subjects"
)

// applyFire records on t occurrence n, due at due and fired at firedAt,
// with nextDue the next occurrence's due time the scheduler chose (nil:
// computed here, for events of older replicas), and reports whether the
// record changed. An occurrence already applied, or one
// that lost the race against a cancel, leaves the record alone.
func applyFire(t *subjects.Timer, n int64, due, firedAt time.Time, nextDue *time.Time, now time.Time) bool {
	if n <= t.FireCount || t.Status != subjects.TimerActive {
		return false
	}
	t.FireCount = n
	fired := firedAt.UTC()
	t.LastFiredAt = &fired
	if t.Repeat {
		next := NextOccurrence(due, t.Interval(), now).UTC()
		if nextDue != nil {
			next = nextDue.UTC()
		}
		t.NextFireAt = &next
	} else {
		t.NextFireAt = nil
		t.Status = subjects.TimerCompleted
	}
	return true
}

// NextOccurrence returns the first point of the cadence due+k*interval (k>=1)
// that lies after now, so a repeating timer that was overdue fires once and
// then keeps its original cadence instead of drifting or catching up.
func NextOccurrence(due time.Time, interval time.Duration, now time.Time) time.Time {
	next := due.Add(interval)
	if next.After(now) {
		return next
	}
	k := now.Sub(due)/interval + 1
	return due.Add(k * interval)
}
