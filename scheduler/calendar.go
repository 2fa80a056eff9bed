package scheduler

import (
	"time"

	"github.com/chime-nats/chime/timers"
)

// calendarAt is when en, armed for an occurrence due at due, fires: its
// due time, later by its jitter for a calendar timer. The due time stays
// the occurrence's identity.
func calendarAt(en *entry, due int64) int64 {
	if en.cal == nil {
		return due
	}
	return en.cal.FireAt(time.Unix(0, due)).UnixNano()
}

// prepareCalendar is prepare for a calendar timer's popped occurrence:
// the timer's calendar decides (timers.Calendar.Step) whether it fires
// (a missed one may be dropped by its catch-up policy) and which
// occurrence comes next; the entry is re-armed there. A dropped one is
// not published: its record update moves the record past it. Called with
// s.mu held.
func (s *Scheduler) prepareCalendar(en *entry, now time.Time) (timers.TimerFired, bool) {
	due := time.Unix(0, en.due).UTC()
	plan := en.cal.Step(en.occ, due, now)
	f := timers.TimerFired{
		AgentID: en.agentID(), TimerID: en.itemID(), Occurrence: en.occ,
		DueAt: due, FiredAt: now.UTC(), Text: (&timers.Timer{ID: en.itemID(), Summary: en.summary}).FireText(),
		Calendar: true, Skipped: !plan.Fire,
	}
	if plan.More {
		next := plan.Next.UTC()
		f.NextDue = &next
	}
	if plan.Fire {
		if en.attempts == 0 {
			s.m.lateness.Observe(now.Sub(en.cal.FireAt(due)).Seconds())
		}
		en.fired = en.occ
		en.occ++
	}
	if plan.More {
		en.due, en.at, en.attempts = plan.Next.UnixNano(), calendarAt(en, plan.Next.UnixNano()), 0
		s.index.arm(en)
	}
	if !plan.Fire {
		s.queueRecord(f)
	}
	return f, plan.Fire
}
