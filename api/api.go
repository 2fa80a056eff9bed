// Package api exposes chime's operations to agents and operators: the NATS
// micro service "chime" (agent.<id>.timer.*, in a queue group so any replica
// answers; agent.<id>.wait.*, .intervention, .lifecycle.*, .trigger.*, and
// the callback ingress callback.wake|enqueue) and the HTTP gateway (the same
// routes, callbacks, operator authentication, /metrics, /healthz, /readyz). Both
// surfaces decode into the same requests and call the same operations, so a
// rule or an error text lives in one place.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/deliveries"
	"github.com/chime-nats/chime/notifications"
	"github.com/chime-nats/chime/questions"
	"github.com/chime-nats/chime/quotas"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waitfor"
	"github.com/chime-nats/chime/waits"
)

// Config says what the operations work on.
type Config struct {
	Timers *timers.Store
	Waits  *waits.Store
	// WaitRequests cancels waits and takes interventions.
	WaitRequests *waits.Requests
	// Triggers, when set, serves the agent lifecycle and triggers, and
	// Callbacks the callback ingress.
	Triggers  *callbacks.Store
	Callbacks *callbacks.Service
	// Tokens, when set, issues and revokes agent tokens.
	Tokens *access.Tokens
	Log    *slog.Logger
	// Questions, when set, serves questions to operators.
	Questions *questions.Service
	// TimeZone is where naive wait times are read when a request has no
	// tz (CHIME_TIMEZONE); empty is UTC.
	TimeZone string
	// Quotas admits timer creates and wait requests; nil admits all.
	Quotas     *quotas.Quotas
	Now        func() time.Time
	Registerer prometheus.Registerer
	// WaitFor serves wait.for, wait.tasks, wait.report and system.wake; nil answers
	// them unavailable.
	WaitFor *waitfor.Service
	// Tasks, when set, serves agent.<id>.task.*.
	Tasks *tasks.Store
	// Agents and Deliveries, when set, serve the operators' views: the
	// agent list, an agent's recent deliveries and their live feed.
	Agents     *agents.Store
	Deliveries *deliveries.Reader
	// Inbox serves agents' own reads of their inboxes (inbox.fetch, inbox.ack).
	Inbox *deliveries.Inbox
	// Notifications, when set, serves notify and the notification
	// history, mark-read, clear and feeds.
	Notifications *notifications.Service
}

// Operations are the agent actions, by the action part of their subject.
type Operations struct {
	store     *timers.Store
	waits     *waits.Store
	waitOps   *waits.Requests
	triggers  *callbacks.Store
	callbacks *callbacks.Service
	tokens    *access.Tokens
	questions *questions.Service
	quotas    *quotas.Quotas
	tz        string
	now       func() time.Time
	log       *slog.Logger
	requests  *prometheus.CounterVec
	// panics counts handler panics recovered, by surface (see recovered).
	panics     *prometheus.CounterVec
	waitFor    *waitfor.Service
	tasks      *tasks.Store
	agents     *agents.Store
	deliveries *deliveries.Reader
	inbox      *deliveries.Inbox
	// notifications serves notify and the notification routes.
	notifications *notifications.Service
	// streams are the event streams open on this replica, by principal,
	// so that a revocation ends them (EndStreams).
	streams openStreams
}

// NewOperations returns the operations.
func NewOperations(c Config) *Operations {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Quotas == nil {
		c.Quotas = quotas.New(quotas.Config{})
	}
	reg := c.Registerer
	o := &Operations{
		store: c.Timers, waits: c.Waits, waitOps: c.WaitRequests, triggers: c.Triggers, callbacks: c.Callbacks, tokens: c.Tokens, quotas: c.Quotas, tz: c.TimeZone, now: c.Now,
		waitFor: c.WaitFor, tasks: c.Tasks, notifications: c.Notifications,
		agents: c.Agents, deliveries: c.Deliveries, inbox: c.Inbox,
		log: c.Log.With("component", "api"), streams: openStreams{byPrincipal: map[string]map[uint64]context.CancelFunc{}},
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chime_requests_total", Help: "Requests by endpoint and outcome (ok or the error code).",
		}, []string{"endpoint", "outcome"}),
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chime_request_panics_total", Help: "Requests whose handler panicked, by surface (nats, http): answered internal, the replica kept running.",
		}, []string{"surface"}),
		questions: c.Questions,
	}
	if reg != nil {
		reg.MustRegister(o.requests, o.panics)
	}
	return o
}

// requestTimeout bounds one operation's storage work.
const requestTimeout = 10 * time.Second

// Do runs one action for an agent on a raw JSON body and returns the reply
// value or an error holding a *subjects.Error (see answerError): storage
// that stays unavailable until the deadline is `unavailable`, never
// `internal`.
func (o *Operations) Do(ctx context.Context, surface, action, agentID string, body []byte) (any, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	res, err := o.do(ctx, surface, action, agentID, body)
	err = o.finish(surface+":"+action, "request", err, "surface", surface, "action", action, "agent_id", agentID)
	return res, err
}

func (o *Operations) do(ctx context.Context, surface, action, agentID string, body []byte) (any, error) {
	if err := subjects.ValidateID("agent_id", agentID); err != nil {
		return nil, err
	}
	if err := o.checkBody(action, len(body)); err != nil {
		return nil, err
	}
	switch action {
	case subjects.ActionTimerCreate:
		spec, err := subjects.DecodeCreateTimer(body, o.quotas.TimerLimits())
		if errors.Is(err, subjects.ErrIntervalTooShort) {
			o.quotas.RefusedInterval()
		}
		if err != nil {
			return nil, err
		}
		// A retry of a create already stored replays it: it creates
		// nothing, so no quota or rate stands in its way.
		if !replay(ctx, o.store.Get, agentID, subjects.TimerIDFor, spec.Request) {
			if err := o.quotas.Timer(ctx, agentID); err != nil {
				return nil, err
			}
		}
		return o.store.Create(ctx, agentID, spec)
	case subjects.ActionInboxFetch, subjects.ActionInboxAck:
		return o.doInbox(ctx, action, agentID, body)
	case subjects.ActionTimerList:
		page, err := subjects.DecodeListTimers(body)
		if err != nil {
			return nil, err
		}
		list, next, err := o.store.List(ctx, agentID, page.Limit, page.Walk(0))
		if err != nil {
			return nil, err
		}
		return subjects.ListTimersReply{Timers: list, NextCursor: subjects.EncodeCursor(action, next)}, nil
	case subjects.ActionTimerGet, subjects.ActionTimerCancel:
		timerID, err := subjects.DecodeTimerRef(body)
		if err != nil {
			return nil, err
		}
		if action == subjects.ActionTimerGet {
			return o.store.Get(ctx, agentID, timerID)
		}
		return o.store.Cancel(ctx, agentID, timerID)
	case subjects.ActionWaitRequest:
		spec, err := subjects.DecodeWaitRequest(body, o.now(), o.tz)
		if err != nil {
			return nil, err
		}
		if !replay(ctx, o.waits.Get, agentID, subjects.WaitIDFor, spec.Request) {
			if err := o.quotas.Wait(ctx, agentID); err != nil {
				return nil, err
			}
		}
		w, err := o.waits.Create(ctx, agentID, spec)
		if err != nil {
			return nil, err
		}
		return subjects.WaitReply{WaitID: w.ID, TargetTime: subjects.FormatISO(w.Target()), Mode: w.Mode}, nil
	case subjects.ActionWaitCancel:
		waitID, err := subjects.DecodeWaitRef(body)
		if err != nil {
			return nil, err
		}
		return o.waitOps.Cancel(ctx, agentID, waitID)
	case subjects.ActionWaitList:
		return o.waitList(ctx, agentID, body)
	case subjects.ActionIntervention:
		req, err := subjects.DecodeIntervention(body)
		if err != nil {
			return nil, err
		}
		return o.waitOps.Intervene(ctx, agentID, req)
	case subjects.ActionWaitFor, subjects.ActionWaitTasks, subjects.ActionWaitReport, subjects.ActionSystemWake:
		return o.doWaitFor(ctx, action, agentID, body)
	case subjects.ActionLifecycleStart, subjects.ActionLifecycleStop, subjects.ActionTriggerCreate,
		subjects.ActionTriggerCancel, subjects.ActionTriggerList, subjects.ActionTriggerReset:
		return o.lifecycle(ctx, surface, action, agentID, body)
	case subjects.ActionTaskStart, subjects.ActionTaskResult, subjects.ActionTaskGet, subjects.ActionTaskList,
		subjects.ActionTaskCancel, subjects.ActionTaskOutput, subjects.ActionTaskOutputAppend:
		return o.task(ctx, action, agentID, body)
	case subjects.ActionTokenIssue, subjects.ActionTokenRevoke:
		if o.tokens == nil {
			return nil, &subjects.Error{Code: subjects.CodeUnavailable, Message: "agent tokens are not configured"}
		}
		if err := subjects.DecodeNoFields(body); err != nil {
			return nil, err
		}
		if action == subjects.ActionTokenIssue {
			return o.tokens.Issue(ctx, agentID)
		}
		return o.tokens.Revoke(ctx, agentID)
	case subjects.ActionQuestionAsk, subjects.ActionQuestionList, subjects.ActionQuestionAnswer:
		return o.question(ctx, action, agentID, body)
	case subjects.ActionNotify, subjects.ActionNotificationsCreate, subjects.ActionNotificationsList,
		subjects.ActionNotificationsMark, subjects.ActionNotificationsClear:
		return o.notification(ctx, action, agentID, body)
	}
	return nil, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: fmt.Sprintf("unknown action %q", action)}
}

// callbackAction names callbacks in the body policy.
const callbackAction = "callback"

// bodyLimit is the one body policy, by action, over HTTP and NATS alike:
// a body beyond its limit is refused with payload_too_large (HTTP 413)
// before it is decoded. Callbacks take 256 KiB (the contract). An
// intervention's text may be as long as its deliveries can carry, which
// Intervene checks against the inbox; its body is bounded by the most
// that could still decode to such a text (every byte escaped as \uXXXX:
// six to one), so that HTTP, where no server's max payload bounds it,
// never reads more. Every other request takes 64 KiB.
func (o *Operations) bodyLimit(action string) int64 {
	switch action {
	case callbackAction:
		return subjects.MaxCallbackBody
	case subjects.ActionIntervention:
		if o.waitOps == nil {
			return subjects.MaxRequestBody
		}
		return 6*o.waitOps.Room() + subjects.MaxRequestBody
	case subjects.ActionTaskOutputAppend:
		return subjects.MaxAppendBody
	default:
		return subjects.MaxRequestBody
	}
}

// checkBody refuses a body of n bytes beyond its action's limit.
func (o *Operations) checkBody(action string, n int) error {
	if limit := o.bodyLimit(action); int64(n) > limit {
		return tooLarge(action, limit)
	}
	return nil
}

func tooLarge(action string, limit int64) error {
	if action == callbackAction {
		return subjects.BodyTooLarge("callback", limit)
	}
	return subjects.BodyTooLarge("request", limit)
}

// replay reports whether a create keyed by req is already stored: the
// store's Create then answers it (the record, or a conflict) without
// creating anything.
func replay[T any](ctx context.Context, get func(context.Context, string, string) (*T, error), agentID string, idFor func(string, string) string, req subjects.RequestKey) bool {
	if req.RequestID == "" {
		return false
	}
	_, err := get(ctx, agentID, idFor(agentID, req.RequestID))
	return err == nil
}

// Actions are the agent actions served.
func Actions() []string {
	return []string{
		subjects.ActionTimerCreate, subjects.ActionTimerList, subjects.ActionTimerGet, subjects.ActionTimerCancel,
		subjects.ActionWaitRequest, subjects.ActionWaitCancel, subjects.ActionWaitList, subjects.ActionIntervention,
		subjects.ActionLifecycleStart, subjects.ActionLifecycleStop, subjects.ActionTriggerCreate,
		subjects.ActionTriggerCancel, subjects.ActionTriggerList, subjects.ActionTriggerReset,
		subjects.ActionTokenIssue, subjects.ActionTokenRevoke,
		subjects.ActionWaitFor, subjects.ActionWaitTasks, subjects.ActionWaitReport, subjects.ActionSystemWake,
		subjects.ActionQuestionAsk, subjects.ActionQuestionList, subjects.ActionQuestionAnswer,
		subjects.ActionTaskStart, subjects.ActionTaskResult, subjects.ActionTaskGet, subjects.ActionTaskList,
		subjects.ActionTaskCancel, subjects.ActionTaskOutput, subjects.ActionTaskOutputAppend,
		subjects.ActionNotify, subjects.ActionNotificationsList, subjects.ActionNotificationsMark, subjects.ActionNotificationsClear,
		subjects.ActionInboxFetch, subjects.ActionInboxAck,
	}
}

// doWaitFor serves the WaitFor actions.
func (o *Operations) doWaitFor(ctx context.Context, action, agentID string, body []byte) (any, error) {
	if o.waitFor == nil {
		return nil, &subjects.Error{Code: subjects.CodeUnavailable, Message: "WaitFor is not configured"}
	}
	switch action {
	case subjects.ActionWaitFor:
		spec, err := subjects.DecodeWaitFor(body)
		if err != nil {
			return nil, err
		}
		if err := o.quotas.WaitFor(agentID, spec.WorkItemID); err != nil {
			return nil, err
		}
		return o.waitFor.WaitFor(ctx, agentID, spec)
	case subjects.ActionWaitTasks:
		spec, err := subjects.DecodeWaitTasks(body)
		if err != nil {
			return nil, err
		}
		if err := o.quotas.WaitFor(agentID, spec.WorkItemID); err != nil {
			return nil, err
		}
		return o.waitFor.WaitTasks(ctx, agentID, spec)
	case subjects.ActionWaitReport:
		req, err := subjects.DecodeWaitReport(body)
		if err != nil {
			return nil, err
		}
		return o.waitFor.Report(ctx, agentID, req)
	}
	req, err := subjects.DecodeSystemWake(body)
	if err != nil {
		return nil, err
	}
	return o.waitFor.SystemWake(ctx, agentID, req)
}

func encode(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		return subjects.MarshalError(err)
	}
	return b
}
