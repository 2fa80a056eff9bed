package notifications

import (
	"context"
	"net/http"

	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/quotas"
	"github.com/chime-nats/chime/subjects"
)

// Actions are the notification actions, served by s (nil: answered
// unavailable); q paces an agent's own notify.
func (s *Service) Actions(q *quotas.Quotas) []action.Action {
	h := func(fn action.Handler) action.Handler {
		return action.When(s != nil, "notifications are not configured", fn)
	}
	return []action.Action{
		{Name: ActionNotify, Tool: &action.Tool{Name: "notify_user", Prompt: "notify_user.md"}, Body: "notification", Reply: "{id, message}", Access: action.Agent, Summary: "notify the user (the console's bell), paced per agent",
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				n, err := DecodeNotify(r.Body, FromAgent)
				if err != nil {
					return nil, err
				}
				if err := q.Notify(r.AgentID); err != nil {
					return nil, err
				}
				item, err := s.Notify(ctx, r.AgentID, n)
				if err != nil {
					return nil, err
				}
				return NotifyReply{ID: item.ID, Message: NotificationSentText}, nil
			})},
		{Name: ActionNotificationsCreate, Body: "notification", Reply: "{id, message}", Access: action.Operator, Summary: "create a notification for the agent (the console's form)",
			HTTPOnly: true, HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/notifications", http.StatusOK, nil),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				// An operator's create is not paced.
				n, err := DecodeNotify(r.Body, FromHTTP)
				if err != nil {
					return nil, err
				}
				item, err := s.Notify(ctx, r.AgentID, n)
				if err != nil {
					return nil, err
				}
				return CreateNotificationReply{Success: true, NotificationID: item.ID, Message: NotificationCreatedText}, nil
			})},
		{Name: ActionNotificationsList, Body: "{since?}", Reply: "{notifications, guid, count, seq, removed?, cleared?}", Access: action.Agent, Summary: "the agent's notification history, or the changes since a sequence",
			Columns: []string{"id", "type", "title", "message", "timestamp", "read"},
			HTTP:    action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/notifications", http.StatusOK, action.Query("since")),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				since, err := DecodeListNotifications(r.Body)
				if err != nil {
					return nil, err
				}
				return s.List(ctx, r.AgentID, since)
			})},
		{Name: ActionNotificationsMark, Body: "{notification_ids} or {mark_all:true}", Reply: "{success, marked_count?, message}", Access: action.Operator, Summary: "mark notifications read",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/notifications/mark-read", http.StatusOK, nil),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				ids, all, err := DecodeMarkRead(r.Body)
				if err != nil {
					return nil, err
				}
				n, err := s.MarkRead(ctx, r.AgentID, ids, all)
				if err != nil {
					return nil, err
				}
				if all {
					return MarkReadReply{Success: true, Message: AllMarkedReadText}, nil
				}
				return MarkReadReply{Success: true, MarkedCount: &n, Message: MarkedReadText(n)}, nil
			})},
		{Name: ActionNotificationsClear, Body: "empty or {}", Reply: "{success, message, guid}", Access: action.Operator, Summary: "remove every notification of the agent",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/notifications/clear", http.StatusOK, nil),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				if err := subjects.DecodeNoFields(r.Body); err != nil {
					return nil, err
				}
				guid, err := s.Clear(ctx, r.AgentID)
				if err != nil {
					return nil, err
				}
				return ClearReply{Success: true, Message: AllClearedText, GUID: guid}, nil
			})},
	}
}
