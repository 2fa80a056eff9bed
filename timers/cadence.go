package timers

import (
	"errors"
	"time"
)

// applyFire records on t occurrence n, due at due and fired at firedAt,
// with nextDue the next occurrence's due time the scheduler chose (nil:
// computed here, for events of older replicas), and reports whether the
// record changed. Occurrences are recorded in order, each only as the
// one the record expects next:
//   - n at or below fire_count was recorded before (or lost a race with a
//     cancel): nothing to do;
//   - n beyond the next one arrived before an earlier one's record update:
//     ErrOutOfOrder, try again once the gap is filled;
//   - the next number with another due time was numbered by a replica that
//     has since lost the shard (the new owner numbered the cadence anew
//     from the record): superseded, nothing to do.
func applyFire(t *Timer, n int64, due, firedAt time.Time, nextDue *time.Time, now time.Time) (bool, error) {
	// A timer paused while this occurrence was on its way records it:
	// it was delivered.
	if n <= t.FireCount || (t.Status != TimerActive && t.Status != TimerPaused) {
		return false, nil
	}
	if n > t.FireCount+1 {
		return false, ErrOutOfOrder
	}
	if t.NextFireAt != nil && !t.NextFireAt.Equal(due) {
		return false, nil
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
		t.Status = TimerCompleted
	}
	return true, nil
}

// Due is when t fires next, and whether it fires at all: an active timer
// at its next_fire_at. A timer that is not finished but does not fire
// still counts against its agent's limit.
func Due(t *Timer) (time.Time, bool) {
	if t.Status != TimerActive || t.NextFireAt == nil {
		return time.Time{}, false
	}
	return *t.NextFireAt, true
}

// ErrOutOfOrder means a timer occurrence's record update came before an
// earlier occurrence's: it applies once that one has.
var ErrOutOfOrder = errors.New("timers: an earlier occurrence is not recorded yet")

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
