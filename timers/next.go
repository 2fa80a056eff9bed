package timers

import (
	"context"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/subjects"
)

// ActionTimerNext previews a timer's next fires.
const ActionTimerNext = "timer.next"

// MaxNoteLen bounds a pause or resume note.
const MaxNoteLen = 1024

// NotedTimerRef is the body of timer.pause and timer.resume: the timer and
// an optional note kept in its record (why it was paused, by whom).
type NotedTimerRef struct {
	TimerID string `json:"timer_id"`
	Note    string `json:"note"`
}

// Validate checks the timer ID and the note's length.
func (r *NotedTimerRef) Validate() error {
	if err := subjects.ValidateID("timer_id", r.TimerID); err != nil {
		return err
	}
	if utf8.RuneCountInString(r.Note) > MaxNoteLen {
		return invalid("note must be at most %d characters", MaxNoteLen)
	}
	return nil
}

// noted serves timer.pause or timer.resume.
func (s *Store) noted(ctx context.Context, r action.Request, do func(ctx context.Context, agentID, timerID, note string) (*Timer, error)) (any, error) {
	var ref NotedTimerRef
	if err := subjects.DecodeStrict(r.Body, &ref); err != nil {
		return nil, err
	}
	if err := ref.Validate(); err != nil {
		return nil, err
	}
	return do(ctx, r.AgentID, ref.TimerID, ref.Note)
}

// NextTimerRequest is the body of timer.next: the timer and how many
// fires to preview (default 5, at most MaxPreview).
type NextTimerRequest struct {
	TimerID string `json:"timer_id"`
	Count   *int   `json:"count"`
}

// Validate checks the request and returns its count.
func (r *NextTimerRequest) Validate() (int, error) {
	if err := subjects.ValidateID("timer_id", r.TimerID); err != nil {
		return 0, err
	}
	if r.Count == nil {
		return 5, nil
	}
	if *r.Count < 1 || *r.Count > MaxPreview {
		return 0, invalid("count must be between 1 and %d, not %d", MaxPreview, *r.Count)
	}
	return *r.Count, nil
}

// NextTimerReply is timer.next's answer: the fires the timer will make if
// nothing changes it (a paused timer: once resumed now), in order. Each
// says its scheduled time and when it fires (later by its jitter).
type NextTimerReply struct {
	TimerID string     `json:"timer_id"`
	Status  string     `json:"status"`
	Fires   []Upcoming `json:"fires"`
}

// nextAction is timer.next.
func (s *Store) nextAction() action.Action {
	return action.Action{Name: ActionTimerNext, Tool: &action.Tool{Prompt: "timers.md"}, Body: "{timer_id, count?}", Reply: "{timer_id, status, fires:[{scheduled_at, fire_at}]}",
		IDField: "timer_id", Access: action.Agent, Summary: "preview a timer's next fires (scheduled time and fire time)",
		HTTP: action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/timers/{timer_id}/next", http.StatusOK, action.Path(map[string]string{"timer_id": "timer_id"}, "count")),
		Handle: func(ctx context.Context, r action.Request) (any, error) {
			var req NextTimerRequest
			if err := subjects.DecodeStrict(r.Body, &req); err != nil {
				return nil, err
			}
			n, err := req.Validate()
			if err != nil {
				return nil, err
			}
			t, err := s.Get(ctx, r.AgentID, req.TimerID)
			if err != nil {
				return nil, err
			}
			return Preview(t, s.now(), n), nil
		}}
}

// Preview is t's next count fires as of now.
func Preview(t *Timer, now time.Time, count int) NextTimerReply {
	out := NextTimerReply{TimerID: t.ID, Status: string(t.Status), Fires: []Upcoming{}}
	if t.Finished() || t.NextFireAt == nil {
		return out
	}
	next := *t.NextFireAt
	if t.Status == TimerPaused {
		if t.IsCalendar() {
			cp := *t
			resumeCalendar(&cp, now)
			if cp.NextFireAt == nil {
				return out
			}
			next = *cp.NextFireAt
		} else if t.Repeat && !next.After(now) {
			next = NextOccurrence(next, t.Interval(), now)
		}
	}
	if t.IsCalendar() {
		cal := CalendarFor(t, nil)
		if cal == nil {
			return out
		}
		out.Fires = cal.Preview(next.Add(-time.Nanosecond), t.FireCount, count)
		return out
	}
	for i := range count {
		if i > 0 && !t.Repeat {
			break
		}
		at := next.Add(time.Duration(i) * t.Interval()).UTC()
		out.Fires = append(out.Fires, Upcoming{ScheduledAt: at, FireAt: at})
	}
	return out
}
