package client

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/notifications"
	"github.com/chime-nats/chime/subjects"
)

// Notification is what Notify sends. Zero fields take chime's defaults
// for agents: type info, priority 20 (high), shown 30 s.
type Notification struct {
	Message string `json:"message"`
	Title   string `json:"title,omitempty"`
	// Detail is HTML, shown expanded.
	Detail   string                             `json:"detail,omitempty"`
	Type     notifications.NotificationType     `json:"type,omitempty"`
	Priority notifications.NotificationPriority `json:"priority,omitempty"`
	// Timeout is how many seconds the notice shows.
	Timeout float64 `json:"timeout,omitempty"`
	// ID, when set, names the notification: sending the same ID again
	// updates it in place (unread again).
	ID    string `json:"id,omitempty"`
	Group string `json:"group,omitempty"`
}

// Notify sends the agent's user a notification and returns its ID.
func (c *Client) Notify(ctx context.Context, n Notification) (*notifications.NotifyReply, error) {
	var r notifications.NotifyReply
	return &r, c.call(ctx, notifications.ActionNotify, n, &r)
}

// Notifications returns the agent's notifications, oldest first; with
// since, only what changed after that sequence (see
// subjects.ListNotificationsReply: ask again with since = the reply's Seq).
func (c *Client) Notifications(ctx context.Context, since *uint64) (*notifications.ListNotificationsReply, error) {
	var r notifications.ListNotificationsReply
	return &r, c.call(ctx, notifications.ActionNotificationsList, notifications.ListNotificationsRequest{Since: since}, &r)
}

// MarkNotificationsRead marks the agent's notifications of ids read, or
// all of them when ids is empty (an operator's request).
func (c *Client) MarkNotificationsRead(ctx context.Context, ids ...string) (*notifications.MarkReadReply, error) {
	req := map[string]any{"mark_all": true}
	if len(ids) > 0 {
		req = map[string]any{"notification_ids": ids}
	}
	var r notifications.MarkReadReply
	return &r, c.call(ctx, notifications.ActionNotificationsMark, req, &r)
}

// ClearNotifications removes every notification of the agent, which gets
// a new guid (an operator's request).
func (c *Client) ClearNotifications(ctx context.Context) (*notifications.ClearReply, error) {
	var r notifications.ClearReply
	return &r, c.call(ctx, notifications.ActionNotificationsClear, struct{}{}, &r)
}

// FollowNotifications calls fn with each change of the agent's
// notifications published on agent.<id>.notifications from now on, until
// the subscription is unsubscribed. Core NATS delivers at most once: a UI
// that must not miss one catches up with Notifications since the last
// Seq it applied, or follows the SSE feed.
func (c *Client) FollowNotifications(fn func(notifications.NotificationChange)) (*nats.Subscription, error) {
	sub, err := c.nc.Subscribe(subjects.Agent(c.agentID, notifications.ActionNotifications), func(m *nats.Msg) {
		var ch notifications.NotificationChange
		if json.Unmarshal(m.Data, &ch) == nil {
			fn(ch)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("client: follow notifications: %w", err)
	}
	return sub, nil
}
