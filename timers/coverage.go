package timers

import (
	"cmp"
	"slices"
	"time"
)

// StoredFire is one stored timer_fired delivery of a repeating timer, as a
// reader of the inbox sees it.
type StoredFire struct {
	Occurrence int64
	DueAt      time.Time
	// NextDueAt is the envelope's next_due_at (nil from earlier versions).
	NextDueAt *time.Time
	// StoredAt is when the stream stored it (its first copy).
	StoredAt time.Time
}

// Coverage is what CadenceCoverage found.
type Coverage struct {
	// Ticks counts the cadence points from the first stored occurrence's
	// due time to the last one's, both included.
	Ticks int
	// Uncovered counts the ticks between two consecutive stored
	// occurrences that the earlier one does not cover: a tick is covered
	// by the occurrence n before it when n was stored after the tick (it
	// fired late, so it is the catch-up fire for the ticks that fell due
	// while it could not fire) and, when n says so, the tick is before
	// n's next_due_at (n declared the ticks it covers). 0 is the contract.
	Uncovered int
	// FirstUncovered is the first uncovered tick (zero when none).
	FirstUncovered time.Time
}

// CadenceCoverage checks a repeating timer's stored occurrences against its
// cadence (interval): every tick due between two consecutive stored
// occurrences must be covered by one catch-up fire, never jumped
// silently. Occurrences missing from the sequence (lost ones) are not
// counted here; the pair around a gap is skipped.
func CadenceCoverage(fires []StoredFire, interval time.Duration) Coverage {
	if interval <= 0 {
		return Coverage{}
	}
	return ScheduleCoverage(fires, func(t time.Time) (time.Time, bool) { return t.Add(interval), true })
}

// ScheduleCoverage is CadenceCoverage for any schedule: next gives the
// tick after t (a calendar timer's Calendar.Next), false when there is
// none.
func ScheduleCoverage(fires []StoredFire, next func(time.Time) (time.Time, bool)) Coverage {
	var c Coverage
	if len(fires) == 0 {
		return c
	}
	fs := slices.Clone(fires)
	slices.SortFunc(fs, func(a, b StoredFire) int {
		return cmp.Or(cmp.Compare(a.Occurrence, b.Occurrence), a.StoredAt.Compare(b.StoredAt))
	})
	fs = slices.CompactFunc(fs, func(a, b StoredFire) bool { return a.Occurrence == b.Occurrence })
	c.Ticks = 1
	for t, ok := next(fs[0].DueAt); ok && !t.After(fs[len(fs)-1].DueAt); t, ok = next(t) {
		c.Ticks++
	}
	for i := 1; i < len(fs); i++ {
		a, b := fs[i-1], fs[i]
		if b.Occurrence != a.Occurrence+1 {
			continue
		}
		for t, ok := next(a.DueAt); ok && t.Before(b.DueAt); t, ok = next(t) {
			covered := !a.StoredAt.Before(t) && (a.NextDueAt == nil || t.Before(*a.NextDueAt))
			if !covered {
				if c.Uncovered == 0 {
					c.FirstUncovered = t
				}
				c.Uncovered++
			}
		}
	}
	return c
}
