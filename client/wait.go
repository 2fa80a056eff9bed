package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/waitfor"
	"github.com/chime-nats/chime/waits"
)

// requestTimeout bounds a request's round trip when the caller's context
// has no deadline of its own.
const requestTimeout = 10 * time.Second

// ErrIntervention is matched (errors.Is) by the error of a wait that an
// intervention cancelled; the error is an *InterventionError with its text.
var ErrIntervention = errors.New("wait cancelled by intervention")

// ErrWaitCancelled is matched by the error of a wait cancelled by a
// wait.cancel request.
var ErrWaitCancelled = errors.New("wait cancelled")

// InterventionError carries the text of the intervention that ended a wait.
type InterventionError struct {
	WaitID string
	Text   string
}

func (e *InterventionError) Error() string {
	return fmt.Sprintf("wait %s cancelled by intervention: %s", e.WaitID, e.Text)
}

// Is makes errors.Is(err, ErrIntervention) hold.
func (e *InterventionError) Is(target error) bool { return target == ErrIntervention }

// WaitRequest asks for a wait: a duration (the parts are summed) or, when
// Until is set, a timestamp.
type WaitRequest struct {
	Seconds, Minutes, Hours, Days int64
	Until                         string // ISO 8601; naive times are read in TZ
	TZ                            string // IANA zone for a naive Until
	ID                            string // optional wait ID of the caller's choosing
	// RequestID, optional (not with ID), makes the request repeatable: a
	// retry with the same one returns the wait the first attempt made,
	// for as long as that wait is kept.
	RequestID string
	// Progress, when set, receives each progress message (about once a
	// second) on the goroutine that called Wait.
	Progress func(waits.WaitProgress)
	// Started, when set, is called with the reply once the wait is
	// registered, e.g. to remember the wait ID for a cancel.
	Started func(waits.WaitReply)
}

func (r *WaitRequest) body() map[string]any {
	b := map[string]any{}
	if r.Until != "" {
		b["until"] = r.Until
	}
	for k, v := range map[string]int64{"seconds": r.Seconds, "minutes": r.Minutes, "hours": r.Hours, "days": r.Days} {
		if v != 0 {
			b[k] = v
		}
	}
	if r.TZ != "" {
		b["tz"] = r.TZ
	}
	if r.ID != "" {
		b["id"] = r.ID
	}
	if r.RequestID != "" {
		b["request_id"] = r.RequestID
	}
	return b
}

// WaitResult is a completed wait.
type WaitResult struct {
	WaitID     string
	TargetTime string // ISO 8601, the possibly extended target
	Text       string // "Wait complete. Reached <target_time>."
}

// Wait registers a wait and blocks until it completes, streaming progress
// to req.Progress. An intervention returns an error matching
// ErrIntervention; ctx ending returns ctx's error and leaves the wait
// running on the server (CancelWait ends it).
func (c *Client) Wait(ctx context.Context, req WaitRequest) (*WaitResult, error) {
	// Subscribe before asking, so the end cannot slip past us.
	events := make(chan *nats.Msg, 64)
	inbox, err := c.nc.ChanSubscribe(subjects.Inbox(c.agentID), events)
	if err != nil {
		return nil, fmt.Errorf("client: wait: %w", err)
	}
	defer func() { _ = inbox.Unsubscribe() }()
	progress, err := c.nc.ChanSubscribe(subjects.Agent(c.agentID, waits.ActionWaitProgress), events)
	if err != nil {
		return nil, fmt.Errorf("client: wait: %w", err)
	}
	defer func() { _ = progress.Unsubscribe() }()
	// The wait may be long; the round trips to set it up are not.
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	if err := c.nc.FlushWithContext(rctx); err != nil {
		return nil, fmt.Errorf("client: wait: %w", err)
	}
	var reply waits.WaitReply
	if err := c.call(rctx, waits.ActionWaitRequest, req.body(), &reply); err != nil {
		return nil, err
	}
	if req.Started != nil {
		req.Started(reply)
	}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case m := <-events:
			if m.Subject != subjects.Inbox(c.agentID) {
				var p waits.WaitProgress
				if json.Unmarshal(m.Data, &p) == nil && p.WaitID == reply.WaitID && req.Progress != nil {
					req.Progress(p)
				}
				continue
			}
			var env subjects.Envelope
			if json.Unmarshal(m.Data, &env) != nil || env.Source.Type != "wait" || env.Source.ID != reply.WaitID {
				continue
			}
			var data waits.WaitEndData
			_ = json.Unmarshal(env.Data, &data)
			switch env.Kind {
			case subjects.KindWaitComplete:
				return &WaitResult{WaitID: reply.WaitID, TargetTime: data.TargetTime, Text: env.Text}, nil
			case subjects.KindWaitCancelled:
				if data.Reason == waits.CancelByRequest {
					return nil, fmt.Errorf("client: wait %s: %w", reply.WaitID, ErrWaitCancelled)
				}
				return nil, &InterventionError{WaitID: reply.WaitID, Text: env.Text}
			}
		}
	}
}

// CancelWait cancels a waiting wait and returns its record.
func (c *Client) CancelWait(ctx context.Context, waitID string) (*waits.Wait, error) {
	var w waits.Wait
	return &w, c.call(ctx, waits.ActionWaitCancel, waits.WaitRef{WaitID: waitID}, &w)
}

// Intervene sends an operator intervention: message, pause, resume or stop.
func (c *Client) Intervene(ctx context.Context, action, text string) error {
	req := map[string]any{"action": action}
	if text != "" {
		req["text"] = text
	}
	return c.call(ctx, waits.ActionIntervention, req, &struct{}{})
}

// WaitFor asks chime to yield until the wake spec names (Holon's
// WaitFor); the reply's continuation says what to do next. A
// delivery=final WaitFor answers awaiting_final_report: commit it with
// Report.
func (c *Client) WaitFor(ctx context.Context, req waitfor.WaitForRequest) (*waitfor.WaitForReply, error) {
	var out waitfor.WaitForReply
	if err := c.call(ctx, waitfor.ActionWaitFor, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// WaitTasks registers a WaitFor over a set of tasks (mode all or any).
func (c *Client) WaitTasks(ctx context.Context, req waitfor.WaitTasksRequest) (*waitfor.WaitForReply, error) {
	var out waitfor.WaitForReply
	if err := c.call(ctx, waitfor.ActionWaitTasks, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Report commits a prepared delivery=final WaitFor with the final report text.
func (c *Client) Report(ctx context.Context, waitID, text string) (*waitfor.WaitForReply, error) {
	var out waitfor.WaitForReply
	if err := c.call(ctx, waitfor.ActionWaitReport, waitfor.WaitReportRequest{WaitID: waitID, Text: text}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListWaits returns the first page of the agent's managed waits and
// WaitFor registrations (WaitsPage).
func (c *Client) ListWaits(ctx context.Context, limit int) (*waits.ListWaitsReply, error) {
	return c.WaitsPage(ctx, limit, "")
}

// WaitsPage returns a page of the agent's managed waits and one of its
// WaitFor registrations, at most limit of each (0: the default), each in
// the order of their last change, as TimersPage does.
func (c *Client) WaitsPage(ctx context.Context, limit int, cursor string) (*waits.ListWaitsReply, error) {
	var out waits.ListWaitsReply
	return &out, c.call(ctx, waits.ActionWaitList, listRequest(limit, cursor), &out)
}
