package timers

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"time"
	_ "time/tzdata" // zones are chime's own: no server needs tzdata

	"github.com/robfig/cron/v3"

	"github.com/chime-nats/chime/subjects"
)

// Calendar timers: a cron expression read in an IANA zone. The expression
// is evaluated on the zone's wall clock (robfig/cron parses it and steps
// it over a clock without daylight saving), and each wall time it names is
// then placed on the time line by the zone's rules and the timer's DST
// policy:
//   - a wall time that happens once is that instant;
//   - a wall time that happens twice (the hour repeated when clocks go
//     back) fires at the first of the two instants, the last, or both
//     (DSTRepeated: first, the default, so a daily job runs once a day, as
//     cron does);
//   - a wall time that never happens (the hour skipped when clocks go
//     forward) fires at the instant the clocks jump (shift, the default,
//     so a daily job at 02:30 still runs that day, as cron does) or not at
//     all (skip).
//
// Several wall times that land on one instant fire once. A calendar timer's
// occurrences are these instants, in order; each is its own occurrence,
// delivered under an envelope ID made of the instant (see EnvelopeID), so
// it is delivered once however many owners reach it.
//
// This file is the one place that says when a calendar timer fires next:
// the scheduler asks Step, a record update asks Step's plan through the
// fire event, timer.next asks Preview.

// DST and catch-up policies.
const (
	DSTFirst = "first"
	DSTLast  = "last"
	DSTBoth  = "both"

	DSTShift = "shift"
	DSTSkip  = "skip"

	CatchUpSkip = "skip"
	CatchUpOne  = "one"
	CatchUpAll  = "all"
)

// Calendar defaults and limits.
const (
	// DefaultCatchUpWindow is the window of catch-up all when none is given.
	DefaultCatchUpWindow = time.Hour
	// MaxCatchUpWindow bounds catchup_window_ms: 7 days.
	MaxCatchUpWindow = 7 * 24 * time.Hour
	// DefaultJitterMax caps the jitter when jitter_max_ms is not given.
	DefaultJitterMax = time.Minute
	// MaxJitterMax bounds jitter_max_ms: one hour.
	MaxJitterMax = time.Hour
	// MissedAfter is the most an occurrence may be late and still count as
	// on time rather than missed (downtime, a takeover): half its period,
	// at most this.
	MissedAfter = 10 * time.Second
	// MaxPreview bounds timer.next's count.
	MaxPreview = 100
)

// parser reads 5 fields (minute first) or 6 (second first) and the
// descriptors (@hourly, @daily, @midnight, @weekly, @monthly, @yearly,
// @annually). @every is refused before it gets here: a fixed period is
// interval_ms.
var parser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// zones caches loaded locations: loading one reads the embedded zip.
var zones sync.Map // name -> *time.Location

func loadZone(name string) (*time.Location, error) {
	if l, ok := zones.Load(name); ok {
		return l.(*time.Location), nil
	}
	l, err := time.LoadLocation(name)
	if err != nil {
		return nil, err
	}
	zones.Store(name, l)
	return l, nil
}

// Calendar is a calendar timer's schedule, compiled from its record.
type Calendar struct {
	spec      string // the record's fields it was made of (CalendarFor reuses it)
	timerID   string
	sched     cron.Schedule
	loc       *time.Location
	repeated  string
	skipped   string
	catchUp   string
	window    time.Duration
	jitter    float64
	jitterMax time.Duration
	start     time.Time // zero: none
	end       time.Time // zero: none
	maxFires  int64     // zero: none
}

// CalendarSpec is a calendar timer's schedule as its record keeps it.
type CalendarSpec struct {
	Cron            string     `json:"cron,omitempty"`
	TZ              string     `json:"tz,omitempty"`
	DSTRepeated     string     `json:"dst_repeated,omitempty"`
	DSTSkipped      string     `json:"dst_skipped,omitempty"`
	CatchUp         string     `json:"catchup,omitempty"`
	CatchUpWindowMs int64      `json:"catchup_window_ms,omitempty"`
	Jitter          float64    `json:"jitter,omitempty"`
	JitterMaxMs     int64      `json:"jitter_max_ms,omitempty"`
	StartAt         *time.Time `json:"start_at,omitempty"`
	EndAt           *time.Time `json:"end_at,omitempty"`
	MaxFires        int64      `json:"max_fires,omitempty"`
}

// IsCalendar reports whether the spec is a calendar timer's.
func (c *CalendarSpec) IsCalendar() bool { return c.Cron != "" }

func (c *CalendarSpec) key() string {
	return fmt.Sprintf("%q|%s|%s|%s|%s|%d|%g|%d|%v|%v|%d", c.Cron, c.TZ, c.DSTRepeated, c.DSTSkipped, c.CatchUp,
		c.CatchUpWindowMs, c.Jitter, c.JitterMaxMs, c.StartAt, c.EndAt, c.MaxFires)
}

// Compile makes the schedule of timer timerID; errors name the field at
// fault. Defaults are filled in.
func (c *CalendarSpec) Compile(timerID string) (*Calendar, error) {
	expr := strings.TrimSpace(c.Cron)
	switch {
	case strings.HasPrefix(expr, "@every"):
		return nil, invalid("cron %q: @every is a fixed period, not a calendar: use interval_ms", c.Cron)
	case strings.HasPrefix(expr, "TZ=") || strings.HasPrefix(expr, "CRON_TZ="):
		return nil, invalid("cron %q: give the zone in tz, not in the expression", c.Cron)
	}
	if !strings.HasPrefix(expr, "@") {
		if n := len(strings.Fields(expr)); n != 5 && n != 6 {
			return nil, invalid("cron %q: want 5 fields (minute hour day-of-month month day-of-week) or 6 (seconds first), not %d", c.Cron, n)
		}
	}
	sched, err := parser.Parse(expr)
	if err != nil {
		return nil, invalid("cron %q: %v", c.Cron, err)
	}
	zone := c.TZ
	if zone == "" {
		zone = "UTC"
	}
	loc, err := loadZone(zone)
	if err != nil || zone == "Local" {
		return nil, invalid("tz %q is not an IANA time zone (e.g. Europe/Berlin)", c.TZ)
	}
	cal := &Calendar{spec: c.key(), timerID: timerID, sched: sched, loc: loc,
		repeated: or(c.DSTRepeated, DSTFirst), skipped: or(c.DSTSkipped, DSTShift), catchUp: or(c.CatchUp, CatchUpOne),
		window: time.Duration(c.CatchUpWindowMs) * time.Millisecond, jitter: c.Jitter,
		jitterMax: time.Duration(c.JitterMaxMs) * time.Millisecond, maxFires: c.MaxFires}
	if !slices.Contains([]string{DSTFirst, DSTLast, DSTBoth}, cal.repeated) {
		return nil, invalid("dst_repeated must be first, last or both, not %q", c.DSTRepeated)
	}
	if !slices.Contains([]string{DSTShift, DSTSkip}, cal.skipped) {
		return nil, invalid("dst_skipped must be shift or skip, not %q", c.DSTSkipped)
	}
	if !slices.Contains([]string{CatchUpSkip, CatchUpOne, CatchUpAll}, cal.catchUp) {
		return nil, invalid("catchup must be skip, one or all, not %q", c.CatchUp)
	}
	switch {
	case c.CatchUpWindowMs < 0:
		return nil, invalid("catchup_window_ms must not be negative, not %d", c.CatchUpWindowMs)
	case c.CatchUpWindowMs > MaxCatchUpWindow.Milliseconds():
		return nil, invalid("catchup_window_ms is too large: at most %d", MaxCatchUpWindow.Milliseconds())
	case c.CatchUpWindowMs > 0 && cal.catchUp == CatchUpSkip:
		return nil, invalid("catchup_window_ms applies to catchup one or all, not skip")
	}
	if cal.catchUp == CatchUpAll && cal.window == 0 {
		cal.window = DefaultCatchUpWindow
	}
	switch {
	case c.Jitter < 0 || c.Jitter >= 1:
		return nil, invalid("jitter is a share of the period: at least 0 and below 1, not %g", c.Jitter)
	case c.JitterMaxMs < 0:
		return nil, invalid("jitter_max_ms must not be negative, not %d", c.JitterMaxMs)
	case c.JitterMaxMs > MaxJitterMax.Milliseconds():
		return nil, invalid("jitter_max_ms is too large: at most %d", MaxJitterMax.Milliseconds())
	}
	if cal.jitterMax == 0 {
		cal.jitterMax = DefaultJitterMax
	}
	if c.MaxFires < 0 {
		return nil, invalid("max_fires must be a positive integer, not %d", c.MaxFires)
	}
	if c.StartAt != nil {
		cal.start = *c.StartAt
	}
	if c.EndAt != nil {
		cal.end = *c.EndAt
		if c.StartAt != nil && !c.EndAt.After(*c.StartAt) {
			return nil, invalid("end_at %s is not after start_at %s", c.EndAt.Format(time.RFC3339), c.StartAt.Format(time.RFC3339))
		}
	}
	return cal, nil
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// CalendarFor is t's compiled schedule, nil for an interval timer or a
// record whose schedule does not compile; prev is reused when it was made
// of the same fields.
func CalendarFor(t *Timer, prev *Calendar) *Calendar {
	if !t.IsCalendar() {
		return nil
	}
	if prev != nil && prev.timerID == t.ID && prev.spec == t.CalendarSpec.key() {
		return prev
	}
	c, err := t.CalendarSpec.Compile(t.ID)
	if err != nil {
		return nil
	}
	return c
}

// naive is the wall clock of t in loc, written as a UTC time.
func naive(t time.Time, loc *time.Location) time.Time {
	l := t.In(loc)
	return time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), l.Second(), l.Nanosecond(), time.UTC)
}

func offsetAt(t time.Time, loc *time.Location) int64 {
	_, off := t.In(loc).Zone()
	return int64(off)
}

// instants are where wall time w (naive) falls on the time line under the
// DST policy, in order: none, one or (repeated hour, both) two.
func (c *Calendar) instants(w time.Time) []time.Time {
	u := w.Unix()
	var offs []int64
	var trans []time.Time
	for _, probe := range []int64{u - 86400, u, u + 86400} {
		at := time.Unix(probe, 0).In(c.loc)
		start, end := at.ZoneBounds()
		for _, b := range []time.Time{start, end} {
			if !b.IsZero() {
				trans = append(trans, b)
				offs = append(offs, offsetAt(b.Add(-time.Second), c.loc), offsetAt(b, c.loc))
			}
		}
		offs = append(offs, offsetAt(at, c.loc))
	}
	slices.Sort(offs)
	offs = slices.Compact(offs)
	var valid []time.Time
	for _, o := range offs {
		t := time.Unix(u-o, int64(w.Nanosecond()))
		if naive(t, c.loc).Equal(w) {
			valid = append(valid, t)
		}
	}
	slices.SortFunc(valid, func(a, b time.Time) int { return a.Compare(b) })
	valid = slices.CompactFunc(valid, time.Time.Equal)
	switch {
	case len(valid) == 1:
		return valid
	case len(valid) > 1:
		switch c.repeated {
		case DSTFirst:
			return valid[:1]
		case DSTLast:
			return valid[len(valid)-1:]
		}
		return valid
	case c.skipped == DSTSkip:
		return nil
	}
	// Skipped: the instant the clocks jump over w.
	for _, tr := range trans {
		before, after := naive(tr.Add(-time.Nanosecond), c.loc), naive(tr, c.loc)
		if before.Before(w) && !after.Before(w) {
			return []time.Time{tr}
		}
	}
	return nil
}

// after is the first instant of the schedule (DST policy applied, start
// and end not) after a; false when the expression names none within the
// parser's five years.
func (c *Calendar) after(a time.Time) (time.Time, bool) {
	lo, hi := offsetAt(a, c.loc), offsetAt(a, c.loc)
	for range 16 {
		best, ok := c.scan(a, lo, hi)
		if !ok {
			return time.Time{}, false
		}
		// Every offset in force between a and best bounds the scan.
		l2, h2 := lo, hi
		for t := a; ; {
			o := offsetAt(t, c.loc)
			l2, h2 = min(l2, o), max(h2, o)
			_, end := t.In(c.loc).ZoneBounds()
			if end.IsZero() || end.After(best) {
				break
			}
			t = end
		}
		if l2 == lo && h2 == hi {
			return best, true
		}
		lo, hi = l2, h2
	}
	return time.Time{}, false
}

// scan finds the first instant after a among the wall times after
// a+lo, given that every offset in force from a on is within [lo, hi].
func (c *Calendar) scan(a time.Time, lo, hi int64) (time.Time, bool) {
	w := time.Unix(a.Unix()+lo, int64(a.Nanosecond())).UTC()
	var best time.Time
	found := false
	for range 1 << 20 {
		w = c.sched.Next(w)
		if w.IsZero() {
			break
		}
		if found && !time.Unix(w.Unix()-hi, 0).Before(best) {
			break // no later wall time lands before best
		}
		for _, t := range c.instants(w) {
			if t.After(a) && (!found || t.Before(best)) {
				best, found = t, true
			}
		}
	}
	return best, found
}

// Next is the first occurrence after a: in the schedule, not before
// start_at, not after end_at. False when there is none.
func (c *Calendar) Next(a time.Time) (time.Time, bool) {
	if !c.start.IsZero() && a.Before(c.start) {
		a = c.start.Add(-time.Nanosecond)
	}
	t, ok := c.after(a)
	if !ok || (!c.end.IsZero() && t.After(c.end)) {
		return time.Time{}, false
	}
	return t.UTC(), true
}

// First is a new timer's first occurrence, created at now.
func (c *Calendar) First(now time.Time) (time.Time, bool) { return c.Next(now) }

// period is the time from scheduled to the schedule's next instant, zero
// when there is none.
func (c *Calendar) period(scheduled time.Time) time.Duration {
	n, ok := c.after(scheduled)
	if !ok {
		return 0
	}
	return n.Sub(scheduled)
}

// Jitter is the delay of the fire of the occurrence scheduled at
// scheduled: a share of the period up to the cap, the same for the same
// timer and scheduled time on every replica (a hash of both), so it
// spreads timers that share a schedule without moving an occurrence's
// identity (the envelope says the scheduled time).
func (c *Calendar) Jitter(scheduled time.Time) time.Duration {
	if c.jitter == 0 {
		return 0
	}
	span := min(time.Duration(c.jitter*float64(c.period(scheduled))), c.jitterMax)
	if span <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(c.timerID))
	h.Write([]byte(scheduled.UTC().Format(time.RFC3339Nano)))
	return time.Duration(h.Sum64() % uint64(span))
}

// FireAt is when the occurrence scheduled at scheduled fires: with its
// jitter.
func (c *Calendar) FireAt(scheduled time.Time) time.Time { return scheduled.Add(c.Jitter(scheduled)) }

// Plan is what the owner of a calendar timer does with one occurrence.
type Plan struct {
	// Fire is false when the occurrence was missed and the catch-up
	// policy drops it.
	Fire bool
	// Late is true when it was missed (reached more than the grace after
	// its fire time).
	Late bool
	// Next is the next occurrence to arm; More is false when there is none
	// (end_at, max_fires): the timer completes.
	Next time.Time
	More bool
}

// grace is how late an occurrence may be and still count as on time.
func (c *Calendar) grace(scheduled time.Time) time.Duration {
	g := c.period(scheduled) / 2
	if g <= 0 || g > MissedAfter {
		g = MissedAfter
	}
	return g
}

// Step decides occurrence n, scheduled at scheduled, reached by its
// owner at now. On time it fires and the next is the schedule's next
// instant. Missed (downtime, a long takeover, a pause's end is not this:
// Resume moves a paused timer past what it missed):
//   - skip: it does not fire; the next is the first not yet missed;
//   - one: it fires once, at once, and the next is the first after now,
//     so everything else missed is dropped (with a window, an occurrence
//     older than the window is dropped and the first within it fires);
//   - all: each occurrence within the window fires, one after another, in
//     order; those older than the window are dropped.
func (c *Calendar) Step(n int64, scheduled, now time.Time) Plan {
	var p Plan
	fireAt := c.FireAt(scheduled)
	p.Late = now.Sub(fireAt) > c.grace(scheduled)
	from := scheduled
	switch {
	case !p.Late:
		p.Fire = true
	case c.catchUp == CatchUpSkip:
		// The first not missed: its fire time (up to the jitter later)
		// within the grace.
		j := c.jitterMax
		if c.jitter == 0 {
			j = 0
		}
		from = later(scheduled, now.Add(-c.grace(scheduled)-j))
	case c.window > 0 && now.Sub(scheduled) > c.window:
		from = later(scheduled, now.Add(-c.window-time.Nanosecond))
	case c.catchUp == CatchUpOne:
		p.Fire = true
		from = later(scheduled, now)
	default: // all
		p.Fire = true
	}
	fired := n - 1
	if p.Fire {
		fired = n
	}
	if c.maxFires > 0 && fired >= c.maxFires {
		return p
	}
	p.Next, p.More = c.Next(from)
	return p
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Resumed is where a calendar timer paused until now picks up: its
// next_fire_at when that is still ahead, else the first occurrence after
// now (what it missed while paused is not caught up).
func (c *Calendar) Resumed(next, now time.Time) (time.Time, bool) {
	if next.After(now) {
		return next, true
	}
	return c.Next(now)
}

// Preview is the next count occurrences from from (after it): scheduled
// times and fire times, jitter included.
func (c *Calendar) Preview(from time.Time, fired int64, count int) []Upcoming {
	var out []Upcoming
	for t, ok := from, true; ok && len(out) < count; {
		if c.maxFires > 0 && fired+int64(len(out)) >= c.maxFires {
			break
		}
		if t, ok = c.Next(t); ok {
			out = append(out, Upcoming{ScheduledAt: t, FireAt: c.FireAt(t)})
		}
	}
	return out
}

// Upcoming is one fire timer.next previews.
type Upcoming struct {
	ScheduledAt time.Time `json:"scheduled_at"`
	FireAt      time.Time `json:"fire_at"`
}

// invalid is an invalid_request with its text.
func invalid(format string, args ...any) error {
	return &subjects.Error{Code: subjects.CodeInvalidRequest, Message: fmt.Sprintf(format, args...)}
}
