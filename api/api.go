// Package api serves the action table on chime's two surfaces: the NATS
// micro service "chime" (one endpoint per action, agent.<id>.<name>, in a
// queue group so any replica answers, plus the callback ingress
// callback.wake|enqueue) and the HTTP gateway (each action's route,
// callbacks, operator and agent authentication, the console's views,
// /metrics, /healthz, /readyz). Each feature package declares its actions
// (see package action); this package lists the features (features), and
// owns what every action shares: body limits, error replies, panics
// recovered, request counts. The managed waits' and the agent lifecycle's
// actions are still declared here (table.go): they combine features.
package api

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/deliveries"
	"github.com/chime-nats/chime/fleet"
	"github.com/chime-nats/chime/internal/pacer"
	"github.com/chime-nats/chime/monitors"
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
	// Monitors, when set, serves agent.<id>.monitor.*.
	Monitors *monitors.Store
	// Agents and Deliveries, when set, serve the operators' views: the
	// agent list, an agent's recent deliveries and their live feed.
	Agents     *agents.Store
	Deliveries *deliveries.Reader
	// Inbox serves agents' own reads of their inboxes (inbox.fetch, inbox.ack).
	Inbox *deliveries.Inbox
	// Notifications, when set, serves notify and the notification
	// history, mark-read, clear and feeds.
	Notifications *notifications.Service
	// Fleet, when set, serves the console's fleet views (GET /api/fleet...).
	Fleet *fleet.Index
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
	// refusedCallbacks paces the info line of refused callbacks (a
	// stopped agent, a revoked trigger, a full inbox): a flood of them is
	// one line per interval, with the count since the last.
	refusedCallbacks *pacer.Pacer
	// panics counts handler panics recovered, by surface (see recovered).
	panics     *prometheus.CounterVec
	waitFor    *waitfor.Service
	tasks      *tasks.Store
	monitors   *monitors.Store
	agents     *agents.Store
	deliveries *deliveries.Reader
	inbox      *deliveries.Inbox
	// notifications serves notify and the notification routes.
	notifications *notifications.Service
	fleet         *fleet.Index
	// streams are the event streams open on this replica, by principal,
	// so that a revocation ends them (EndStreams).
	streams openStreams
	// table is every action, with its handler (features).
	table *action.Table
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
		waitFor: c.WaitFor, tasks: c.Tasks, monitors: c.Monitors, notifications: c.Notifications,
		agents: c.Agents, deliveries: c.Deliveries, inbox: c.Inbox, fleet: c.Fleet,
		log: c.Log.With("component", "api"), refusedCallbacks: pacer.New(refusedLogInterval), streams: openStreams{byPrincipal: map[string]map[uint64]context.CancelFunc{}},
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
	t, err := action.NewTable(o.features()...)
	if err != nil {
		panic(err) // the declarations are constant: a test would have caught it
	}
	o.table = t
	return o
}

// requestTimeout bounds one operation's storage work.
const requestTimeout = 10 * time.Second

// Do runs one action for an agent on a raw JSON body and returns the reply
// value or an error holding a *subjects.Error (see answerError): storage
// that stays unavailable until the deadline is `unavailable`, never
// `internal`.
func (o *Operations) Do(ctx context.Context, surface, name, agentID string, body []byte) (any, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	res, err := o.do(ctx, surface, name, agentID, body)
	err = o.finish(surface+":"+name, "request", err, "surface", surface, "action", name, "agent_id", agentID)
	if a, ok := o.table.Lookup(name); err == nil && ok && a.Access == action.Operator && a.Changes() {
		// What an operator changed (an agent started or stopped, a token
		// issued or revoked, an intervention) is the log's at info.
		o.log.Info("operator action", "action", name, "agent_id", agentID, "surface", surface)
	}
	return res, err
}

func (o *Operations) do(ctx context.Context, surface, name, agentID string, body []byte) (any, error) {
	if err := subjects.ValidateID("agent_id", agentID); err != nil {
		return nil, err
	}
	a, ok := o.table.Lookup(name)
	if !ok {
		return nil, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: fmt.Sprintf("unknown action %q", name)}
	}
	if err := o.checkBody(name, len(body)); err != nil {
		return nil, err
	}
	return a.Handle(ctx, action.Request{Surface: surface, AgentID: agentID, Body: body})
}

// callbackAction names callbacks in the body policy.
const callbackAction = "callback"

// bodyLimit is the one body policy, by action, over HTTP and NATS alike:
// a body beyond its limit is refused with payload_too_large (HTTP 413)
// before it is decoded. Callbacks take 256 KiB (the contract); each action
// names its own limit (action.Action.MaxBody), 64 KiB unless it says.
func (o *Operations) bodyLimit(name string) int64 {
	if name == callbackAction {
		return callbacks.MaxCallbackBody
	}
	if a, ok := o.table.Lookup(name); ok {
		return a.Limit()
	}
	return subjects.MaxRequestBody
}

// checkBody refuses a body of n bytes beyond its action's limit.
func (o *Operations) checkBody(name string, n int) error {
	if limit := o.bodyLimit(name); int64(n) > limit {
		return tooLarge(name, limit)
	}
	return nil
}

func tooLarge(action string, limit int64) error {
	if action == callbackAction {
		return subjects.BodyTooLarge("callback", limit)
	}
	return subjects.BodyTooLarge("request", limit)
}

// Actions returns the actions served over NATS, by name.
func (o *Operations) Actions() []string { return o.table.Names(action.Operator) }

// Table returns the action table the operations serve.
func (o *Operations) Table() *action.Table { return o.table }

func encode(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		return subjects.MarshalError(err)
	}
	return b
}
