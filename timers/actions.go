package timers

import (
	"context"
	"errors"
	"net/http"

	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/quotas"
	"github.com/chime-nats/chime/subjects"
)

// Actions are the timer actions, served by s under q's limits.
func (s *Store) Actions(q *quotas.Quotas) []action.Action {
	ref := action.Path(map[string]string{"timer_id": "timer_id"})
	return append([]action.Action{
		{Name: subjects.ActionTimerCreate, Tool: &action.Tool{Prompt: "timers.md"}, Body: "{duration_ms, interval_ms?, summary?, authority_class?, request_id?} or {cron, tz?, dst_repeated?, dst_skipped?, catchup?, catchup_window_ms?, jitter?, jitter_max_ms?, start_at?, end_at?, max_fires?, summary?, request_id?}", Reply: "timer record", Access: action.Agent, Summary: "create a one-shot, repeating or calendar (cron, time zone) timer that fires into the agent's inbox",
			HTTP:   action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/timers", http.StatusCreated, nil),
			Handle: func(ctx context.Context, r action.Request) (any, error) { return s.create(ctx, q, r) }},
		{Name: subjects.ActionTimerList, Tool: &action.Tool{Prompt: "timers.md"}, Body: "{limit?, cursor?}", Reply: "{timers, next_cursor}", Access: action.Agent, Summary: "list the agent's timers, a page at a time",
			Columns: []string{"id", "status", "next_fire_at", "interval_ms", "cron", "tz", "fire_count", "summary"},
			HTTP:    action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/timers", http.StatusOK, action.List), Handle: s.list},
		{Name: subjects.ActionTimerGet, Tool: &action.Tool{Prompt: "timers.md"}, Body: "{timer_id}", Reply: "timer record", IDField: "timer_id", Access: action.Agent, Summary: "read one timer",
			HTTP: action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/timers/{timer_id}", http.StatusOK, ref),
			Handle: func(ctx context.Context, r action.Request) (any, error) {
				return s.byRef(ctx, r, s.Get)
			}},
		{Name: subjects.ActionTimerCancel, Tool: &action.Tool{Prompt: "timers.md"}, Body: "{timer_id}", Reply: "timer record", IDField: "timer_id", Access: action.Agent, Summary: "cancel a timer before it fires again",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/timers/{timer_id}/cancel", http.StatusOK, ref),
			Handle: func(ctx context.Context, r action.Request) (any, error) {
				return s.byRef(ctx, r, s.Cancel)
			}},
	}, append(s.pauseActions(), s.nextAction())...)
}

// create serves timer.create.
func (s *Store) create(ctx context.Context, q *quotas.Quotas, r action.Request) (any, error) {
	spec, err := DecodeCreateTimer(r.Body, TimerLimits{MinInterval: q.MinInterval()})
	if errors.Is(err, ErrIntervalTooShort) {
		q.RefusedInterval()
	}
	if err != nil {
		return nil, err
	}
	if !action.Replayed(ctx, s.Get, r.AgentID, spec.Request.RequestID, subjects.TimerIDFor) {
		if err := q.Timer(ctx, r.AgentID); err != nil {
			return nil, err
		}
	}
	return s.Create(ctx, r.AgentID, spec)
}

// list serves timer.list.
func (s *Store) list(ctx context.Context, r action.Request) (any, error) {
	page, err := DecodeListTimers(r.Body)
	if err != nil {
		return nil, err
	}
	list, next, err := s.List(ctx, r.AgentID, page.Limit, page.Walk(0))
	if err != nil {
		return nil, err
	}
	return ListTimersReply{Timers: list, NextCursor: subjects.EncodeCursor(subjects.ActionTimerList, next)}, nil
}

// byRef serves an action on one timer named by its body's timer_id.
func (s *Store) byRef(ctx context.Context, r action.Request, do func(ctx context.Context, agentID, timerID string) (*Timer, error)) (any, error) {
	timerID, err := DecodeTimerRef(r.Body)
	if err != nil {
		return nil, err
	}
	return do(ctx, r.AgentID, timerID)
}
