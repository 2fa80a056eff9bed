package monitors

import (
	"context"
	"net/http"

	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/subjects"
)

// Actions are the monitor actions, served by s (nil: answered unavailable).
func (s *Store) Actions() []action.Action {
	h := func(fn action.Handler) action.Handler {
		return action.When(s != nil, "monitors are not configured", fn)
	}
	ref := action.Path(map[string]string{"monitor_id": "monitor_id"})
	return []action.Action{
		{Name: ActionStart, Tool: &action.Tool{Prompt: "monitors.md"}, Body: "{description, one of command, subject, ws, http, match?, exclude?, timeout_ms? or persistent?, max_events?, idle_timeout_ms?, interval_ms? (http only), monitor_id?}", Reply: "monitor record", Access: action.Agent,
			Summary: "start a monitor: a standing watch whose events reach the inbox in batches",
			HTTP:    action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/monitors", http.StatusCreated, nil),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				spec, err := DecodeStart(r.Body)
				if err != nil {
					return nil, err
				}
				return s.Start(ctx, r.AgentID, spec)
			})},
		{Name: ActionStop, Tool: &action.Tool{Prompt: "monitors.md"}, Body: "{monitor_id, exit_code?}", Reply: "monitor record", IDField: "monitor_id", Access: action.Agent,
			Summary: "stop a monitor; its monitor_stopped reaches the inbox",
			HTTP:    action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/monitors/{monitor_id}/stop", http.StatusOK, action.PathField("monitor_id")),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				req, err := DecodeStop(r.Body)
				if err != nil {
					return nil, err
				}
				return s.Stop(ctx, r.AgentID, req)
			})},
		{Name: ActionEmit, Body: "{monitor_id, seq, lines}", Reply: "{monitor_id, next_seq, status, stop_reason?, delivered, suppressed?, filtered?, duplicate?, superseded?}", IDField: "monitor_id", Access: action.Agent,
			Summary: "send a batch of a monitor's source's lines (an executor's call): filtered, paced and delivered as one monitor_event",
			MaxBody: func() int64 { return MaxEmitBody },
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				req, err := DecodeEmit(r.Body)
				if err != nil {
					return nil, err
				}
				return s.Emit(ctx, r.AgentID, req)
			})},
		{Name: ActionGet, Tool: &action.Tool{Prompt: "monitors.md"}, Body: "{monitor_id}", Reply: "monitor record", IDField: "monitor_id", Access: action.Agent,
			Summary: "read one monitor",
			HTTP:    action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/monitors/{monitor_id}", http.StatusOK, ref),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				id, err := DecodeRef(r.Body)
				if err != nil {
					return nil, err
				}
				return s.Get(ctx, r.AgentID, id)
			})},
		{Name: ActionList, Tool: &action.Tool{Prompt: "monitors.md"}, Body: "{limit?, cursor?}", Reply: "{monitors, next_cursor}", Access: action.Agent,
			Summary: "list the agent's monitors, a page at a time",
			Columns: []string{"monitor_id", "status", "description", "events", "suppressed", "stop_reason"},
			HTTP:    action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/monitors", http.StatusOK, action.List),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				page, err := DecodeList(r.Body)
				if err != nil {
					return nil, err
				}
				list, next, err := s.List(ctx, r.AgentID, page.Limit, page.Walk(0))
				if err != nil {
					return nil, err
				}
				return ListReply{Monitors: list, NextCursor: subjects.EncodeCursor(ActionList, next)}, nil
			})},
	}
}
