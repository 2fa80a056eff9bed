package timers

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/chime-nats/chime/subjects"
)

// calendar validates the calendar form of a create and returns its spec,
// defaults filled in, so that the record states every policy.
func (r *CreateTimerRequest) calendar(l TimerLimits) (CalendarSpec, error) {
	if !subjects.IsNull(r.DurationMs) {
		return CalendarSpec{}, invalid("duration_ms and cron do not go together: a calendar timer's first fire is its schedule's (use start_at to begin later)")
	}
	if !subjects.IsNull(r.IntervalMs) {
		return CalendarSpec{}, invalid("interval_ms and cron do not go together: give one of them")
	}
	c := CalendarSpec{Cron: r.Cron, TZ: r.TZ, DSTRepeated: r.DSTRepeated, DSTSkipped: r.DSTSkipped, CatchUp: r.CatchUp}
	var err error
	if c.CatchUpWindowMs, err = optionalMs("catchup_window_ms", r.CatchUpWindowMs); err != nil {
		return CalendarSpec{}, err
	}
	if c.JitterMaxMs, err = optionalMs("jitter_max_ms", r.JitterMaxMs); err != nil {
		return CalendarSpec{}, err
	}
	if !subjects.IsNull(r.MaxFires) {
		if c.MaxFires, err = subjects.PositiveInt("max_fires", r.MaxFires, 1<<53); err != nil {
			return CalendarSpec{}, err
		}
	}
	if r.Jitter != nil {
		c.Jitter = *r.Jitter
	}
	if c.StartAt, err = instant("start_at", r.StartAt); err != nil {
		return CalendarSpec{}, err
	}
	if c.EndAt, err = instant("end_at", r.EndAt); err != nil {
		return CalendarSpec{}, err
	}
	cal, err := c.Compile("")
	if err != nil {
		return CalendarSpec{}, err
	}
	if gap := cal.shortestGap(); gap > 0 && gap < l.MinInterval {
		wire := invalid("cron %q fires every %s; calendar timers may fire at most every %d ms", r.Cron, gap, l.MinInterval.Milliseconds())
		return CalendarSpec{}, fmt.Errorf("%w (%w)", wire, ErrIntervalTooShort)
	}
	// The record states every policy.
	if c.TZ == "" {
		c.TZ = "UTC"
	}
	c.DSTRepeated, c.DSTSkipped, c.CatchUp = cal.repeated, cal.skipped, cal.catchUp
	if cal.catchUp != CatchUpSkip {
		c.CatchUpWindowMs = cal.window.Milliseconds()
	}
	if c.Jitter > 0 {
		c.JitterMaxMs = cal.jitterMax.Milliseconds()
	} else {
		c.JitterMaxMs = 0
	}
	return c, nil
}

// noCalendar refuses the calendar fields without cron.
func (r *CreateTimerRequest) noCalendar() error {
	for name, set := range map[string]bool{
		"tz": r.TZ != "", "dst_repeated": r.DSTRepeated != "", "dst_skipped": r.DSTSkipped != "", "catchup": r.CatchUp != "",
		"catchup_window_ms": !subjects.IsNull(r.CatchUpWindowMs), "jitter": r.Jitter != nil, "jitter_max_ms": !subjects.IsNull(r.JitterMaxMs),
		"start_at": r.StartAt != nil, "end_at": r.EndAt != nil, "max_fires": !subjects.IsNull(r.MaxFires),
	} {
		if set {
			return invalid("%s applies to calendar timers: give cron too", name)
		}
	}
	return nil
}

// optionalMs reads an optional non-negative integer of milliseconds; the
// range is Compile's to check, with its texts.
func optionalMs(field string, raw json.RawMessage) (int64, error) {
	if subjects.IsNull(raw) {
		return 0, nil
	}
	var n int64
	if err := json.Unmarshal(raw, &n); err != nil {
		return 0, invalid("%s must be an integer of milliseconds, not %s", field, raw)
	}
	return n, nil
}

// instant reads an optional RFC 3339 time.
func instant(field string, s *string) (*time.Time, error) {
	if s == nil {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339Nano, *s)
	if err != nil {
		return nil, invalid("%s must be an RFC 3339 time with a zone (2026-03-08T09:00:00-05:00), not %q", field, *s)
	}
	t = t.UTC()
	return &t, nil
}

// shortestGap is the shortest time between two consecutive wall times of
// the expression, over its first ones from a fixed day: how often it fires
// at most (a DST shift can bring two closer; they are rare).
func (c *Calendar) shortestGap() time.Duration {
	w := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var gap time.Duration
	prev := c.sched.Next(w)
	for range 64 {
		if prev.IsZero() {
			break
		}
		n := c.sched.Next(prev)
		if n.IsZero() {
			break
		}
		if d := n.Sub(prev); gap == 0 || d < gap {
			gap = d
		}
		prev = n
	}
	return gap
}

// createCalendar fills in a new calendar timer t, created at now: its
// first fire; an invalid_request when its schedule has none.
func createCalendar(t *Timer, spec CalendarSpec, now time.Time) error {
	t.CalendarSpec = spec
	cal, err := spec.Compile(t.ID)
	if err != nil {
		return err
	}
	first, ok := cal.First(now)
	if !ok {
		return invalid("cron %q has no fire between now (or start_at) and end_at", spec.Cron)
	}
	t.NextFireAt = &first
	t.DurationMs = max(first.Sub(now).Milliseconds(), 0)
	t.Repeat = true
	return nil
}

// applyCalendarFire writes occurrence ev into calendar timer t, as
// applyFire does for an interval timer, with two differences: the event
// says the next due time itself (nil: it was the last, the timer
// completes), and an occurrence may come due later than next_fire_at
// (its owner skipped missed ones, see Step); an earlier one is superseded.
func applyCalendarFire(t *Timer, ev *TimerFired) (bool, error) {
	n := ev.Occurrence
	if n <= t.FireCount || (t.Status != TimerActive && t.Status != TimerPaused) {
		return false, nil
	}
	if n > t.FireCount+1 {
		return false, ErrOutOfOrder
	}
	if t.NextFireAt != nil && ev.DueAt.Before(*t.NextFireAt) {
		return false, nil
	}
	if !ev.Skipped {
		t.FireCount = n
		fired := ev.FiredAt.UTC()
		t.LastFiredAt = &fired
	}
	if ev.NextDue == nil {
		t.NextFireAt, t.Status = nil, TimerCompleted
		return true, nil
	}
	next := ev.NextDue.UTC()
	t.NextFireAt = &next
	return true, nil
}

// resumeCalendar is resume for a calendar timer: at its next_fire_at when
// still ahead, else at its first occurrence after now; completed when it
// has none left.
func resumeCalendar(t *Timer, now time.Time) {
	cal := CalendarFor(t, nil)
	if cal == nil {
		return
	}
	if t.NextFireAt == nil {
		t.NextFireAt = &now
	}
	next, ok := cal.Resumed(*t.NextFireAt, now)
	if !ok {
		t.NextFireAt, t.Status = nil, TimerCompleted
		return
	}
	t.NextFireAt = &next
}
