// Package api exposes chime's operations to agents and operators: the NATS
// micro service "chime" (agent.<id>.timer.*, in a queue group so any replica
// answers) and the HTTP gateway with /metrics, /healthz and /readyz. Both
// surfaces decode into the same requests and call the same operations, so a
// rule or an error text lives in one place.
package api

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// Operations are the agent actions, by the action part of their subject.
type Operations struct {
	store    *timers.Store
	log      *slog.Logger
	requests *prometheus.CounterVec
}

// NewOperations returns the operations over a timer store.
func NewOperations(store *timers.Store, log *slog.Logger, reg prometheus.Registerer) *Operations {
	o := &Operations{
		store: store,
		log:   log.With("component", "api"),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chime_requests_total", Help: "Requests by endpoint and outcome (ok or the error code).",
		}, []string{"endpoint", "outcome"}),
	}
	if reg != nil {
		reg.MustRegister(o.requests)
	}
	return o
}

// requestTimeout bounds one operation's storage work.
const requestTimeout = 10 * time.Second

// Do runs one action for an agent on a raw JSON body and returns the reply
// value or a *subjects.Error.
func (o *Operations) Do(ctx context.Context, surface, action, agentID string, body []byte) (any, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	res, err := o.do(ctx, action, agentID, body)
	outcome := "ok"
	if err != nil {
		e := subjects.AsError(err)
		outcome = e.Code
		if e.Code == subjects.CodeInternal {
			o.log.Error("request failed", "surface", surface, "action", action, "agent_id", agentID, "err", err)
		}
		err = e
	}
	o.requests.WithLabelValues(surface+":"+action, outcome).Inc()
	return res, err
}

func (o *Operations) do(ctx context.Context, action, agentID string, body []byte) (any, error) {
	if err := subjects.ValidateID("agent_id", agentID); err != nil {
		return nil, err
	}
	switch action {
	case subjects.ActionTimerCreate:
		var req subjects.CreateTimerRequest
		if err := subjects.DecodeStrict(body, &req); err != nil {
			return nil, err
		}
		spec, err := req.Validate()
		if err != nil {
			return nil, err
		}
		return o.store.Create(ctx, agentID, spec)
	case subjects.ActionTimerList:
		var req subjects.ListTimersRequest
		if err := subjects.DecodeStrict(body, &req); err != nil {
			return nil, err
		}
		limit, err := subjects.ParseLimit(req.Limit)
		if err != nil {
			return nil, err
		}
		list, err := o.store.List(ctx, agentID, limit)
		if err != nil {
			return nil, err
		}
		return subjects.ListTimersReply{Timers: list}, nil
	case subjects.ActionTimerGet, subjects.ActionTimerCancel:
		var req subjects.TimerRef
		if err := subjects.DecodeStrict(body, &req); err != nil {
			return nil, err
		}
		if err := req.Validate(); err != nil {
			return nil, err
		}
		if action == subjects.ActionTimerGet {
			return o.store.Get(ctx, agentID, req.TimerID)
		}
		return o.store.Cancel(ctx, agentID, req.TimerID)
	}
	return nil, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: fmt.Sprintf("unknown action %q", action)}
}

// Actions are the agent actions served.
var Actions = []string{subjects.ActionTimerCreate, subjects.ActionTimerList, subjects.ActionTimerGet, subjects.ActionTimerCancel}

func encode(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		return subjects.MarshalError(err)
	}
	return b
}
