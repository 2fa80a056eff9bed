package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/notifications"
)

// notify runs `chime notify send|list|read|clear|follow`: an agent's
// notifications to its user, and an operator's view of them.
func (a *App) notify(ctx context.Context, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return fmt.Errorf("%w: notify needs a command: send, list, read, clear or follow", ErrUsage)
	}
	sub, args := args[0], args[1:]
	fs := newFlagSet(a, "notify "+sub)
	agent := fs.String("agent", envOr("CHIME_AGENT_ID", "demo"), "agent ID")
	var n client.Notification
	fs.StringVar(&n.Title, "title", "", "a short heading (send)")
	fs.StringVar(&n.Detail, "detail", "", "more, as HTML, shown expanded (send)")
	typ := fs.String("type", "", "info, success, warning, error or progress (send; default info)")
	prio := fs.Int("priority", 0, "20 high or 10 normal (send; default 20)")
	fs.Float64Var(&n.Timeout, "timeout", 0, "seconds the notice shows (send; default 30)")
	fs.StringVar(&n.ID, "id", "", "the same ID again updates a notification in place (send)")
	fs.StringVar(&n.Group, "group", "", "notices of one group show together (send)")
	since := fs.Int64("since", -1, "only what changed after this sequence (list, follow)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	n.Type, n.Priority = notifications.NotificationType(*typ), notifications.NotificationPriority(*prio)
	var from *uint64
	if *since >= 0 {
		s := uint64(*since)
		from = &s
	}
	switch sub {
	case "send":
		if len(pos) != 1 {
			return fmt.Errorf("%w: notify send needs one message (quote it)", ErrUsage)
		}
		n.Message = pos[0]
		return a.request(ctx, *agent, func(ctx context.Context, c *client.Client) (any, error) {
			return c.Notify(ctx, n)
		})
	case "list":
		return a.request(ctx, *agent, func(ctx context.Context, c *client.Client) (any, error) {
			return c.Notifications(ctx, from)
		})
	case "read":
		return a.request(ctx, *agent, func(ctx context.Context, c *client.Client) (any, error) {
			return c.MarkNotificationsRead(ctx, pos...)
		})
	case "clear":
		return a.request(ctx, *agent, func(ctx context.Context, c *client.Client) (any, error) {
			return c.ClearNotifications(ctx)
		})
	case "follow":
		return a.followNotifications(ctx, *agent, from)
	}
	return fmt.Errorf("%w: unknown notify command %q", ErrUsage, sub)
}

// followNotifications prints each change of the agent's notifications as
// one JSON line until Ctrl-C; with since, the history since it first.
func (a *App) followNotifications(ctx context.Context, agentID string, since *uint64) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	c, closeConn, err := a.agentClient(agentID)
	if err != nil {
		return err
	}
	defer closeConn()
	changes := make(chan notifications.NotificationChange, 1024)
	sub, err := c.FollowNotifications(func(ch notifications.NotificationChange) {
		select {
		case changes <- ch:
		default: // a terminal that cannot keep up loses lines, not memory
		}
	})
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	enc := json.NewEncoder(a.Stdout)
	if since != nil {
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		h, err := c.Notifications(rctx, since)
		cancel()
		if err != nil {
			return err
		}
		if err := enc.Encode(h); err != nil {
			return err
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ch := <-changes:
			if err := enc.Encode(ch); err != nil {
				return err
			}
		}
	}
}
