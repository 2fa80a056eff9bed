// Package client is the Go client agents use to talk to chime over NATS:
// managed waits with live progress, timers and inbox subscriptions, with
// chime's wire errors returned as *subjects.Error so callers can match them
// with errors.Is.
package client

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/deliveries"
	"github.com/chime-nats/chime/internal/liveness"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// Client speaks for one agent.
type Client struct {
	nc      *nats.Conn
	agentID string
}

// New returns a client for agentID over nc.
func New(nc *nats.Conn, agentID string) (*Client, error) {
	if err := subjects.ValidateID("agent_id", agentID); err != nil {
		return nil, err
	}
	return &Client{nc: nc, agentID: agentID}, nil
}

// Request sends a raw body to agent.<id>.<action> and decodes the reply into out.
func (c *Client) Request(ctx context.Context, action string, body []byte, out any) error {
	msg, err := c.nc.RequestWithContext(ctx, subjects.Agent(c.agentID, action), body)
	if err != nil {
		return fmt.Errorf("client: %s: %w", action, err)
	}
	return subjects.DecodeReply(msg.Data, out)
}

func (c *Client) call(ctx context.Context, action string, req, out any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("client: encode: %w", err)
	}
	return c.Request(ctx, action, body, out)
}

// TimerOption adds to a timer create.
type TimerOption func(map[string]any)

// WithRequestID makes the create repeatable: a retry with the same
// request_id (after a timeout or an `unavailable`, say) returns the timer
// the first attempt made instead of making another, for as long as that
// timer is kept; the same request_id with other fields is an error
// matching subjects.ErrConflict.
func WithRequestID(id string) TimerOption {
	return func(req map[string]any) { req["request_id"] = id }
}

// CreateTimer creates a timer due after durationMs, repeating every
// intervalMs when that is positive.
func (c *Client) CreateTimer(ctx context.Context, durationMs, intervalMs int64, summary string, opts ...TimerOption) (*timers.Timer, error) {
	req := map[string]any{"duration_ms": durationMs}
	if intervalMs > 0 {
		req["interval_ms"] = intervalMs
	}
	return c.createTimer(ctx, req, summary, opts)
}

// createTimer sends a timer.create of req, with its summary and options.
func (c *Client) createTimer(ctx context.Context, req map[string]any, summary string, opts []TimerOption) (*timers.Timer, error) {
	if summary != "" {
		req["summary"] = summary
	}
	for _, opt := range opts {
		opt(req)
	}
	var t timers.Timer
	return &t, c.call(ctx, subjects.ActionTimerCreate, req, &t)
}

// CreateCalendarTimer creates a calendar timer: it fires at each instant
// of spec's schedule (its cron in its zone, with its DST, catch-up and
// jitter policies).
func (c *Client) CreateCalendarTimer(ctx context.Context, spec timers.CalendarSpec, summary string, opts ...TimerOption) (*timers.Timer, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("client: encode: %w", err)
	}
	req := map[string]any{}
	if err := json.Unmarshal(b, &req); err != nil {
		return nil, fmt.Errorf("client: encode: %w", err)
	}
	return c.createTimer(ctx, req, summary, opts)
}

// ListTimers returns the first page of the agent's timers (TimersPage);
// limit 0 uses the default.
func (c *Client) ListTimers(ctx context.Context, limit int) ([]timers.Timer, error) {
	r, err := c.TimersPage(ctx, limit, "")
	if err != nil {
		return nil, err
	}
	return r.Timers, nil
}

// TimersPage returns a page of the agent's timers, in the order of their
// last change, oldest first: the first for cursor "", else the one the
// cursor (an earlier page's NextCursor) names. limit 0 uses the default.
// A timer changed after its page comes again on a later one.
func (c *Client) TimersPage(ctx context.Context, limit int, cursor string) (*timers.ListTimersReply, error) {
	var r timers.ListTimersReply
	return &r, c.call(ctx, subjects.ActionTimerList, listRequest(limit, cursor), &r)
}

// AllTimers reads every page of the agent's timers and returns them, each
// once as last read.
func (c *Client) AllTimers(ctx context.Context) ([]timers.Timer, error) {
	return all(ctx, func(ctx context.Context, cursor string) ([]timers.Timer, string, error) {
		r, err := c.TimersPage(ctx, subjects.MaxListLimit, cursor)
		if err != nil {
			return nil, "", err
		}
		return r.Timers, r.NextCursor, nil
	}, func(t *timers.Timer) string { return t.ID })
}

// GetTimer reads one timer.
func (c *Client) GetTimer(ctx context.Context, timerID string) (*timers.Timer, error) {
	var t timers.Timer
	return &t, c.call(ctx, subjects.ActionTimerGet, timers.TimerRef{TimerID: timerID}, &t)
}

// CancelTimer cancels one timer.
func (c *Client) CancelTimer(ctx context.Context, timerID string) (*timers.Timer, error) {
	var t timers.Timer
	return &t, c.call(ctx, subjects.ActionTimerCancel, timers.TimerRef{TimerID: timerID}, &t)
}

// SubscribeInbox delivers the agent's inbox envelopes to fn as they are
// published (core NATS: for the durable history, resuming where it left off, use
// FetchInbox and AckInbox).
func (c *Client) SubscribeInbox(fn func(subjects.Envelope)) (*nats.Subscription, error) {
	return c.nc.Subscribe(subjects.Inbox(c.agentID), func(m *nats.Msg) {
		var env subjects.Envelope
		if json.Unmarshal(m.Data, &env) == nil {
			fn(env)
		}
	})
}

// FetchInbox returns up to max of the agent's deliveries it has not acked
// (max 0: chime's default), oldest first, waiting up to wait (at most
// subjects.MaxInboxWait) for one when there are none. What is not acked
// comes again at the next fetch: an envelope's ID tells a repeat.
func (c *Client) FetchInbox(ctx context.Context, max int, wait time.Duration) (*deliveries.InboxFetchReply, error) {
	req := map[string]any{}
	if max > 0 {
		req["max"] = max
	}
	if wait > 0 {
		req["wait_ms"] = wait.Milliseconds()
	}
	var r deliveries.InboxFetchReply
	return &r, c.call(ctx, deliveries.ActionInboxFetch, req, &r)
}

// AckInbox marks every delivery up to and including seq handled.
func (c *Client) AckInbox(ctx context.Context, seq uint64) (uint64, error) {
	var r deliveries.InboxAckReply
	err := c.call(ctx, deliveries.ActionInboxAck, map[string]any{"seq": seq}, &r)
	return r.Acked, err
}

// ConnectOptions are what an agent's connection needs: when NATS
// authorization is on, its token and the reply prefix its rights allow
// (replies elsewhere would be refused; harmless when authorization is
// off); and, on a cluster, the bounds that make it leave within seconds a
// server it can no longer reach (a ping every 2 s with at most 2
// unanswered, a write given up after 4 s, then another server tried). A
// server cut off by the network does not close the socket: with nats.go's
// defaults the connection looks up for minutes while every request on it
// times out. chime's own connections carry the same bounds.
func ConnectOptions(agentID, token string) []nats.Option {
	opts := []nats.Option{nats.CustomInboxPrefix(access.AgentInboxPrefix(agentID))}
	opts = append(opts, liveness.Options()...)
	if token != "" {
		opts = append(opts, nats.Token(token))
	}
	return opts
}
