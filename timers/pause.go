package timers

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/subjects"
)

// Pausing a timer: it keeps its record, its place in its cadence
// (next_fire_at) and its place under its agent's limit, but does not fire
// until it is resumed. Resumed, it fires at its next_fire_at when that is
// still ahead; when it passed meanwhile, a one-shot fires at once and a
// repeating timer at its cadence's next point after the resume: the
// occurrences due while it was paused are skipped, not caught up.
const (
	ActionTimerPause  = "timer.pause"
	ActionTimerResume = "timer.resume"

	// TimerPaused is the status of a paused timer.
	TimerPaused TimerStatus = "paused"

	// CodeTimerCancelled refuses to pause or resume a cancelled timer.
	CodeTimerCancelled = "timer_cancelled"
)

// pauseActions are timer.pause and timer.resume.
func (s *Store) pauseActions() []action.Action {
	return []action.Action{
		{Name: ActionTimerPause, Tool: &action.Tool{Prompt: "timers.md"}, Body: "{timer_id, note?}", Reply: "timer record", IDField: "timer_id", Access: action.Agent,
			Summary: "pause a timer: it keeps its place but does not fire until resumed",
			HTTP:    action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/timers/{timer_id}/pause", http.StatusOK, action.PathField("timer_id")),
			Handle: func(ctx context.Context, r action.Request) (any, error) {
				return s.noted(ctx, r, s.PauseNoted)
			}},
		{Name: ActionTimerResume, Tool: &action.Tool{Prompt: "timers.md"}, Body: "{timer_id, note?}", Reply: "timer record", IDField: "timer_id", Access: action.Agent,
			Summary: "resume a paused timer at its cadence's next point",
			HTTP:    action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/timers/{timer_id}/resume", http.StatusOK, action.PathField("timer_id")),
			Handle: func(ctx context.Context, r action.Request) (any, error) {
				return s.noted(ctx, r, s.ResumeNoted)
			}},
	}
}

// Pause pauses an active timer. Pausing a paused timer is a no-op that
// returns the record; a finished one cannot be paused.
func (s *Store) Pause(ctx context.Context, agentID, timerID string) (*Timer, error) {
	return s.PauseNoted(ctx, agentID, timerID, "")
}

// PauseNoted is Pause with a note, kept in the record (a note on a timer
// already paused replaces its note).
func (s *Store) PauseNoted(ctx context.Context, agentID, timerID, note string) (*Timer, error) {
	t, _, err := s.update(ctx, agentID, timerID, func(t *Timer) (bool, error) {
		if err := unfinished(t, "pause"); err != nil {
			return false, err
		}
		if t.Status == TimerPaused {
			if note == "" || note == t.Note {
				return false, nil
			}
			t.Note = note
			return true, nil
		}
		t.Status = TimerPaused
		if note != "" {
			t.Note = note
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("timers: pause %s: %w", timerID, err)
	}
	return t, nil
}

// Resume makes a paused timer fire again (see the rule above). Resuming an
// active timer is a no-op that returns the record.
func (s *Store) Resume(ctx context.Context, agentID, timerID string) (*Timer, error) {
	return s.ResumeNoted(ctx, agentID, timerID, "")
}

// ResumeNoted is Resume with a note, kept in the record.
func (s *Store) ResumeNoted(ctx context.Context, agentID, timerID, note string) (*Timer, error) {
	t, _, err := s.update(ctx, agentID, timerID, func(t *Timer) (bool, error) {
		if err := unfinished(t, "resume"); err != nil || t.Status != TimerPaused {
			return false, err
		}
		resume(t, s.now())
		if note != "" {
			t.Note = note
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("timers: resume %s: %w", timerID, err)
	}
	return t, nil
}

// resume makes paused t active at now, due as the rule above says.
func resume(t *Timer, now time.Time) {
	t.Status = TimerActive
	if t.IsCalendar() {
		resumeCalendar(t, now)
		return
	}
	if t.NextFireAt == nil {
		// Not written by Pause; fire at once rather than never.
		t.NextFireAt = &now
		return
	}
	if t.Repeat && !t.NextFireAt.After(now) {
		next := NextOccurrence(*t.NextFireAt, t.Interval(), now).UTC()
		t.NextFireAt = &next
	}
}

// unfinished refuses to verb a finished timer.
func unfinished(t *Timer, verb string) error {
	switch t.Status {
	case TimerCompleted:
		return &subjects.Error{Code: subjects.CodeTimerCompleted, Message: "cannot " + verb + " completed timer " + t.ID}
	case TimerCancelled:
		return &subjects.Error{Code: CodeTimerCancelled, Message: "cannot " + verb + " cancelled timer " + t.ID, Status: http.StatusConflict}
	}
	return nil
}
