package api

import (
	"context"
	"errors"
	"net/http"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/subjects"
)

// Routes' paths: agents' reads under /api/agents/{id}, operators' writes
// under /api/control/agents/{id} (see guard).
const (
	agentRoutes   = "/api/agents/{id}"
	controlRoutes = "/api/control/agents/{id}"
)

// httpRoute is an action's HTTP route.
func httpRoute(method, path string, status int, body func(*http.Request, []byte) []byte) *action.Route {
	return &action.Route{Method: method, Path: path, Status: status, Body: body}
}

// by serves an action through a handler of several, which it tells apart
// by name.
func by(name string, fn func(ctx context.Context, action, agentID string, body []byte) (any, error)) action.Handler {
	return func(ctx context.Context, r action.Request) (any, error) { return fn(ctx, name, r.AgentID, r.Body) }
}

// features are the actions of every feature, in the order the service
// lists them. Adding a feature's actions is one line here.
func (o *Operations) features() [][]action.Action {
	return [][]action.Action{
		o.timerActions(),
		o.waitActions(),
		o.lifecycleActions(),
		o.tokenActions(),
		o.waitForActions(),
		o.questionActions(),
		o.taskActions(),
		o.notificationActions(),
		o.inboxActions(),
	}
}

func (o *Operations) timerActions() []action.Action {
	ref := action.Path(map[string]string{"timer_id": "timer_id"})
	return []action.Action{
		{Name: subjects.ActionTimerCreate, Access: action.Agent, Summary: "create a one-shot or repeating timer that fires into the agent's inbox",
			HTTP: httpRoute(http.MethodPost, controlRoutes+"/timers", http.StatusCreated, nil), Handle: o.createTimer},
		{Name: subjects.ActionTimerList, Access: action.Agent, Summary: "list the agent's timers, a page at a time",
			HTTP: httpRoute(http.MethodGet, agentRoutes+"/timers", http.StatusOK, action.List), Handle: o.listTimers},
		{Name: subjects.ActionTimerGet, Access: action.Agent, Summary: "read one timer",
			HTTP: httpRoute(http.MethodGet, agentRoutes+"/timers/{timer_id}", http.StatusOK, ref), Handle: by(subjects.ActionTimerGet, o.timerRef)},
		{Name: subjects.ActionTimerCancel, Access: action.Agent, Summary: "cancel a timer before it fires again",
			HTTP: httpRoute(http.MethodPost, controlRoutes+"/timers/{timer_id}/cancel", http.StatusOK, ref), Handle: by(subjects.ActionTimerCancel, o.timerRef)},
	}
}

func (o *Operations) waitActions() []action.Action {
	return []action.Action{
		{Name: subjects.ActionWaitRequest, Access: action.Agent, Summary: "wait for a duration or until a time; the end is delivered to the inbox", Handle: o.requestWait},
		{Name: subjects.ActionWaitCancel, Access: action.Agent, Summary: "cancel a managed wait", Handle: o.cancelWait},
		{Name: subjects.ActionWaitList, Access: action.Agent, Summary: "list the agent's managed waits and WaitFor registrations",
			HTTP:   httpRoute(http.MethodGet, agentRoutes+"/waits", http.StatusOK, action.List),
			Handle: func(ctx context.Context, r action.Request) (any, error) { return o.waitList(ctx, r.AgentID, r.Body) }},
		{Name: subjects.ActionIntervention, Access: action.Operator, Summary: "message, pause, resume or stop an agent: in-flight waits end",
			MaxBody: o.interventionLimit,
			HTTP:    httpRoute(http.MethodPost, controlRoutes+"/intervention", http.StatusOK, nil), Handle: o.intervene},
	}
}

func (o *Operations) lifecycleActions() []action.Action {
	h := func(name string) action.Handler {
		return func(ctx context.Context, r action.Request) (any, error) {
			return o.lifecycle(ctx, r.Surface, name, r.AgentID, r.Body)
		}
	}
	return []action.Action{
		{Name: subjects.ActionLifecycleStart, Access: action.Operator, Summary: "start the agent: its callback triggers accept calls",
			HTTP: httpRoute(http.MethodPost, controlRoutes+"/start", http.StatusOK, nil), Handle: h(subjects.ActionLifecycleStart)},
		{Name: subjects.ActionLifecycleStop, Access: action.Operator, Summary: "stop the agent: its callback triggers are revoked",
			HTTP: httpRoute(http.MethodPost, controlRoutes+"/stop", http.StatusOK, nil), Handle: h(subjects.ActionLifecycleStop)},
		{Name: subjects.ActionTriggerCreate, Access: action.Operator, Summary: "create a callback trigger (a URL an external system calls)",
			HTTP: httpRoute(http.MethodPost, controlRoutes+"/triggers", http.StatusCreated, nil), Handle: h(subjects.ActionTriggerCreate)},
		{Name: subjects.ActionTriggerCancel, Access: action.Operator, Summary: "cancel a callback trigger",
			HTTP: httpRoute(http.MethodPost, controlRoutes+"/triggers/{trigger_id}/cancel", http.StatusOK,
				action.Path(map[string]string{"external_trigger_id": "trigger_id"})), Handle: h(subjects.ActionTriggerCancel)},
		{Name: subjects.ActionTriggerList, Access: action.Operator, Summary: "list the agent's callback triggers",
			HTTP: httpRoute(http.MethodGet, agentRoutes+"/triggers", http.StatusOK, action.NoBody), Handle: h(subjects.ActionTriggerList)},
		{Name: subjects.ActionTriggerReset, Access: action.Operator, Summary: "replace the agent's default callback trigger and its URL",
			HTTP: httpRoute(http.MethodPost, controlRoutes+"/reset-callback", http.StatusOK, nil), Handle: h(subjects.ActionTriggerReset)},
	}
}

func (o *Operations) tokenActions() []action.Action {
	return []action.Action{
		{Name: subjects.ActionTokenIssue, Access: action.Operator, Summary: "issue an agent token (shown once)",
			HTTP: httpRoute(http.MethodPost, controlRoutes+"/token", http.StatusCreated, nil), Handle: by(subjects.ActionTokenIssue, o.token)},
		{Name: subjects.ActionTokenRevoke, Access: action.Operator, Summary: "revoke the agent's tokens and end its connections",
			HTTP: httpRoute(http.MethodDelete, controlRoutes+"/token", http.StatusOK, nil), Handle: by(subjects.ActionTokenRevoke, o.token)},
	}
}

func (o *Operations) waitForActions() []action.Action {
	return []action.Action{
		{Name: subjects.ActionWaitFor, Access: action.Agent, Summary: "yield until a task result, timer, callback or recheck wakes the agent",
			Handle: by(subjects.ActionWaitFor, o.doWaitFor)},
		{Name: subjects.ActionWaitTasks, Access: action.Agent, Summary: "yield until all or any of a set of tasks have results",
			Handle: by(subjects.ActionWaitTasks, o.doWaitFor)},
		{Name: subjects.ActionWaitReport, Access: action.Agent, Summary: "commit a prepared WaitFor with the agent's final report",
			Handle: by(subjects.ActionWaitReport, o.doWaitFor)},
		{Name: subjects.ActionSystemWake, Access: action.Operator, Summary: "wake the agent's WaitFor registrations as a system event",
			Handle: by(subjects.ActionSystemWake, o.doWaitFor)},
	}
}

func (o *Operations) questionActions() []action.Action {
	return []action.Action{
		{Name: subjects.ActionQuestionAsk, Access: action.Agent, Summary: "ask the operator a question; the answer is delivered to the inbox",
			Handle: by(subjects.ActionQuestionAsk, o.question)},
		{Name: subjects.ActionQuestionList, Access: action.Agent, Summary: "list the agent's questions (open ones unless all)",
			HTTP: httpRoute(http.MethodGet, agentRoutes+"/questions", http.StatusOK, func(r *http.Request, _ []byte) []byte {
				m := map[string]any{}
				if all := r.URL.Query().Get("all"); all != "" {
					m["all"] = action.RawBoolOrString(all)
				}
				if c := r.URL.Query().Get("cursor"); c != "" {
					m["cursor"] = c
				}
				return action.WithQuery(r, m, "limit")
			}), Handle: by(subjects.ActionQuestionList, o.question)},
		{Name: subjects.ActionQuestionAnswer, Access: action.Operator, Summary: "answer an agent's question",
			HTTP: httpRoute(http.MethodPost, controlRoutes+"/questions/{question_id}/answer", http.StatusOK, func(r *http.Request, read []byte) []byte {
				return subjects.WithQuestionID(read, r.PathValue("question_id"))
			}), Handle: by(subjects.ActionQuestionAnswer, o.question)},
	}
}

func (o *Operations) taskActions() []action.Action {
	ref := action.Path(map[string]string{"task_id": "task_id"})
	return []action.Action{
		{Name: subjects.ActionTaskStart, Access: action.Agent, Summary: "start a task: background work whose result reaches the inbox",
			Handle: by(subjects.ActionTaskStart, o.task)},
		{Name: subjects.ActionTaskResult, Access: action.Agent, Summary: "report a task's result (completed, failed, interrupted)",
			Handle: by(subjects.ActionTaskResult, o.task)},
		{Name: subjects.ActionTaskGet, Access: action.Agent, Summary: "read one task",
			HTTP: httpRoute(http.MethodGet, agentRoutes+"/tasks/{task_id}", http.StatusOK, ref), Handle: by(subjects.ActionTaskGet, o.task)},
		{Name: subjects.ActionTaskList, Access: action.Agent, Summary: "list the agent's tasks, a page at a time",
			HTTP: httpRoute(http.MethodGet, agentRoutes+"/tasks", http.StatusOK, action.List), Handle: by(subjects.ActionTaskList, o.task)},
		{Name: subjects.ActionTaskCancel, Access: action.Agent, Summary: "ask a running task to stop",
			Handle: by(subjects.ActionTaskCancel, o.task)},
		{Name: subjects.ActionTaskOutput, Access: action.Agent, Summary: "read a task's output from an offset",
			HTTP: httpRoute(http.MethodGet, agentRoutes+"/tasks/{task_id}/output", http.StatusOK,
				action.Path(map[string]string{"task_id": "task_id"}, "offset", "limit")), Handle: by(subjects.ActionTaskOutput, o.task)},
		{Name: subjects.ActionTaskOutputAppend, Access: action.Agent, Summary: "append to a running task's output",
			MaxBody: func() int64 { return subjects.MaxAppendBody }, Handle: by(subjects.ActionTaskOutputAppend, o.task)},
	}
}

func (o *Operations) notificationActions() []action.Action {
	return []action.Action{
		{Name: subjects.ActionNotify, Access: action.Agent, Summary: "notify the user (the console's bell), paced per agent",
			Handle: by(subjects.ActionNotify, o.notification)},
		{Name: subjects.ActionNotificationsCreate, Access: action.Operator, Summary: "create a notification for the agent (the console's form)",
			HTTPOnly: true, HTTP: httpRoute(http.MethodPost, controlRoutes+"/notifications", http.StatusOK, nil),
			Handle: by(subjects.ActionNotificationsCreate, o.notification)},
		{Name: subjects.ActionNotificationsList, Access: action.Agent, Summary: "the agent's notification history, or the changes since a sequence",
			HTTP: httpRoute(http.MethodGet, agentRoutes+"/notifications", http.StatusOK, action.Query("since")), Handle: by(subjects.ActionNotificationsList, o.notification)},
		{Name: subjects.ActionNotificationsMark, Access: action.Operator, Summary: "mark notifications read",
			HTTP: httpRoute(http.MethodPost, controlRoutes+"/notifications/mark-read", http.StatusOK, nil), Handle: by(subjects.ActionNotificationsMark, o.notification)},
		{Name: subjects.ActionNotificationsClear, Access: action.Operator, Summary: "remove every notification of the agent",
			HTTP: httpRoute(http.MethodPost, controlRoutes+"/notifications/clear", http.StatusOK, nil), Handle: by(subjects.ActionNotificationsClear, o.notification)},
	}
}

func (o *Operations) inboxActions() []action.Action {
	return []action.Action{
		{Name: subjects.ActionInboxFetch, Access: action.Agent, Summary: "read the inbox reliably from the agent's cursor",
			HTTP: httpRoute(http.MethodGet, agentRoutes+"/inbox/fetch", http.StatusOK, action.Query("max", "after", "wait_ms")), Handle: by(subjects.ActionInboxFetch, o.doInbox)},
		{Name: subjects.ActionInboxAck, Access: action.Agent, Summary: "acknowledge the inbox up to a sequence, moving the cursor",
			HTTP: httpRoute(http.MethodPost, agentRoutes+"/inbox/ack", http.StatusOK, nil), Handle: by(subjects.ActionInboxAck, o.doInbox)},
	}
}

// createTimer serves timer.create.
func (o *Operations) createTimer(ctx context.Context, r action.Request) (any, error) {
	spec, err := subjects.DecodeCreateTimer(r.Body, o.quotas.TimerLimits())
	if errors.Is(err, subjects.ErrIntervalTooShort) {
		o.quotas.RefusedInterval()
	}
	if err != nil {
		return nil, err
	}
	// A retry of a create already stored replays it: it creates nothing,
	// so no quota or rate stands in its way.
	if !replay(ctx, o.store.Get, r.AgentID, subjects.TimerIDFor, spec.Request) {
		if err := o.quotas.Timer(ctx, r.AgentID); err != nil {
			return nil, err
		}
	}
	return o.store.Create(ctx, r.AgentID, spec)
}

// listTimers serves timer.list.
func (o *Operations) listTimers(ctx context.Context, r action.Request) (any, error) {
	page, err := subjects.DecodeListTimers(r.Body)
	if err != nil {
		return nil, err
	}
	list, next, err := o.store.List(ctx, r.AgentID, page.Limit, page.Walk(0))
	if err != nil {
		return nil, err
	}
	return subjects.ListTimersReply{Timers: list, NextCursor: subjects.EncodeCursor(subjects.ActionTimerList, next)}, nil
}

// timerRef serves timer.get and timer.cancel.
func (o *Operations) timerRef(ctx context.Context, name, agentID string, body []byte) (any, error) {
	timerID, err := subjects.DecodeTimerRef(body)
	if err != nil {
		return nil, err
	}
	if name == subjects.ActionTimerGet {
		return o.store.Get(ctx, agentID, timerID)
	}
	return o.store.Cancel(ctx, agentID, timerID)
}

// requestWait serves wait.request.
func (o *Operations) requestWait(ctx context.Context, r action.Request) (any, error) {
	spec, err := subjects.DecodeWaitRequest(r.Body, o.now(), o.tz)
	if err != nil {
		return nil, err
	}
	if !replay(ctx, o.waits.Get, r.AgentID, subjects.WaitIDFor, spec.Request) {
		if err := o.quotas.Wait(ctx, r.AgentID); err != nil {
			return nil, err
		}
	}
	w, err := o.waits.Create(ctx, r.AgentID, spec)
	if err != nil {
		return nil, err
	}
	return subjects.WaitReply{WaitID: w.ID, TargetTime: subjects.FormatISO(w.Target()), Mode: w.Mode}, nil
}

// cancelWait serves wait.cancel.
func (o *Operations) cancelWait(ctx context.Context, r action.Request) (any, error) {
	waitID, err := subjects.DecodeWaitRef(r.Body)
	if err != nil {
		return nil, err
	}
	return o.waitOps.Cancel(ctx, r.AgentID, waitID)
}

// intervene serves intervention.
func (o *Operations) intervene(ctx context.Context, r action.Request) (any, error) {
	req, err := subjects.DecodeIntervention(r.Body)
	if err != nil {
		return nil, err
	}
	return o.waitOps.Intervene(ctx, r.AgentID, req)
}

// interventionLimit: an intervention's text may be as long as its
// deliveries can carry, which Intervene checks against the inbox; its
// body is bounded by the most that could still decode to such a text
// (every byte escaped as \uXXXX: six to one), so that HTTP, where no
// server's max payload bounds it, never reads more.
func (o *Operations) interventionLimit() int64 {
	if o.waitOps == nil {
		return subjects.MaxRequestBody
	}
	return 6*o.waitOps.Room() + subjects.MaxRequestBody
}

// token serves token.issue and token.revoke.
func (o *Operations) token(ctx context.Context, name, agentID string, body []byte) (any, error) {
	if o.tokens == nil {
		return nil, &subjects.Error{Code: subjects.CodeUnavailable, Message: "agent tokens are not configured"}
	}
	if err := subjects.DecodeNoFields(body); err != nil {
		return nil, err
	}
	if name == subjects.ActionTokenIssue {
		return o.tokens.Issue(ctx, agentID)
	}
	return o.tokens.Revoke(ctx, agentID)
}

// Rights are what principals may request over NATS, from the action table
// (which needs no storage to be read).
func Rights() access.Rights { return access.RightsOf(NewOperations(Config{}).table) }
