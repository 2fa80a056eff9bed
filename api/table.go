package api

import (
	"context"
	"net/http"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/subjects"
)

// by serves an action through a handler of several, which it tells apart
// by name.
func by(name string, fn func(ctx context.Context, action, agentID string, body []byte) (any, error)) action.Handler {
	return func(ctx context.Context, r action.Request) (any, error) { return fn(ctx, name, r.AgentID, r.Body) }
}

// features are the actions of every feature, in the order the service
// lists them. Adding a feature's actions is one line here.
func (o *Operations) features() [][]action.Action {
	return [][]action.Action{
		o.store.Actions(o.quotas),
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

func (o *Operations) waitActions() []action.Action {
	return []action.Action{
		{Name: subjects.ActionWaitRequest, Access: action.Agent, Summary: "wait for a duration or until a time; the end is delivered to the inbox", Handle: o.requestWait},
		{Name: subjects.ActionWaitCancel, IDField: "wait_id", Access: action.Agent, Summary: "cancel a managed wait", Handle: o.cancelWait},
		{Name: subjects.ActionWaitList, Access: action.Agent, Summary: "list the agent's managed waits and WaitFor registrations",
			Columns: []string{"wait_id", "status", "mode", "target_time", "wake", "resource", "reason", "work_item_id"},
			HTTP:    action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/waits", http.StatusOK, action.List),
			Handle:  func(ctx context.Context, r action.Request) (any, error) { return o.waitList(ctx, r.AgentID, r.Body) }},
		{Name: subjects.ActionIntervention, Command: "intervene", Access: action.Operator, Summary: "message, pause, resume or stop an agent: in-flight waits end",
			MaxBody: o.interventionLimit,
			HTTP:    action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/intervention", http.StatusOK, nil), Handle: o.intervene},
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
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/start", http.StatusOK, nil), Handle: h(subjects.ActionLifecycleStart)},
		{Name: subjects.ActionLifecycleStop, Access: action.Operator, Summary: "stop the agent: its callback triggers are revoked",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/stop", http.StatusOK, nil), Handle: h(subjects.ActionLifecycleStop)},
		{Name: subjects.ActionTriggerCreate, Access: action.Operator, Summary: "create a callback trigger (a URL an external system calls)",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/triggers", http.StatusCreated, nil), Handle: h(subjects.ActionTriggerCreate)},
		{Name: subjects.ActionTriggerCancel, IDField: "external_trigger_id", Access: action.Operator, Summary: "cancel a callback trigger",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/triggers/{trigger_id}/cancel", http.StatusOK,
				action.Path(map[string]string{"external_trigger_id": "trigger_id"})), Handle: h(subjects.ActionTriggerCancel)},
		{Name: subjects.ActionTriggerList, Access: action.Operator, Summary: "list the agent's callback triggers",
			Columns: []string{"external_trigger_id", "status", "delivery_mode", "label", "default", "created_at"},
			HTTP:    action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/triggers", http.StatusOK, action.NoBody), Handle: h(subjects.ActionTriggerList)},
		{Name: subjects.ActionTriggerReset, Access: action.Operator, Summary: "replace the agent's default callback trigger and its URL",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/reset-callback", http.StatusOK, nil), Handle: h(subjects.ActionTriggerReset)},
	}
}

func (o *Operations) tokenActions() []action.Action {
	return []action.Action{
		{Name: subjects.ActionTokenIssue, Access: action.Operator, Summary: "issue an agent token (shown once)",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/token", http.StatusCreated, nil), Handle: by(subjects.ActionTokenIssue, o.token)},
		{Name: subjects.ActionTokenRevoke, Access: action.Operator, Summary: "revoke the agent's tokens and end its connections",
			HTTP: action.HTTPRoute(http.MethodDelete, action.ControlRoutes+"/token", http.StatusOK, nil), Handle: by(subjects.ActionTokenRevoke, o.token)},
	}
}

func (o *Operations) waitForActions() []action.Action {
	return []action.Action{
		{Name: subjects.ActionWaitFor, Command: "wait-for", Access: action.Agent, Summary: "yield until a task result, timer, callback or recheck wakes the agent",
			Handle: by(subjects.ActionWaitFor, o.doWaitFor)},
		{Name: subjects.ActionWaitTasks, Command: "wait-tasks", Access: action.Agent, Summary: "yield until all or any of a set of tasks have results",
			Handle: by(subjects.ActionWaitTasks, o.doWaitFor)},
		{Name: subjects.ActionWaitReport, Command: "wait-report", Access: action.Agent, Summary: "commit a prepared WaitFor with the agent's final report",
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
			Columns: []string{"id", "status", "created_at", "questions", "answers"},
			HTTP: action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/questions", http.StatusOK, func(r *http.Request, _ []byte) []byte {
				m := map[string]any{}
				if all := r.URL.Query().Get("all"); all != "" {
					m["all"] = action.RawBoolOrString(all)
				}
				if c := r.URL.Query().Get("cursor"); c != "" {
					m["cursor"] = c
				}
				return action.WithQuery(r, m, "limit")
			}), Handle: by(subjects.ActionQuestionList, o.question)},
		{Name: subjects.ActionQuestionAnswer, IDField: "question_id", Access: action.Operator, Summary: "answer an agent's question",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/questions/{question_id}/answer", http.StatusOK, func(r *http.Request, read []byte) []byte {
				return subjects.WithQuestionID(read, r.PathValue("question_id"))
			}), Handle: by(subjects.ActionQuestionAnswer, o.question)},
	}
}

func (o *Operations) taskActions() []action.Action {
	ref := action.Path(map[string]string{"task_id": "task_id"})
	return []action.Action{
		{Name: subjects.ActionTaskStart, Access: action.Agent, Summary: "start a task: background work whose result reaches the inbox",
			Handle: by(subjects.ActionTaskStart, o.task)},
		{Name: subjects.ActionTaskResult, IDField: "task_id", Access: action.Agent, Summary: "report a task's result (completed, failed, interrupted)",
			Handle: by(subjects.ActionTaskResult, o.task)},
		{Name: subjects.ActionTaskGet, IDField: "task_id", Access: action.Agent, Summary: "read one task",
			HTTP: action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/tasks/{task_id}", http.StatusOK, ref), Handle: by(subjects.ActionTaskGet, o.task)},
		{Name: subjects.ActionTaskList, Access: action.Agent, Summary: "list the agent's tasks, a page at a time",
			Columns: []string{"task_id", "status", "title", "created_at", "ended_at", "exit_code"},
			HTTP:    action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/tasks", http.StatusOK, action.List), Handle: by(subjects.ActionTaskList, o.task)},
		{Name: subjects.ActionTaskCancel, IDField: "task_id", Access: action.Agent, Summary: "ask a running task to stop",
			Handle: by(subjects.ActionTaskCancel, o.task)},
		{Name: subjects.ActionTaskOutput, IDField: "task_id", Access: action.Agent, Summary: "read a task's output from an offset",
			HTTP: action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/tasks/{task_id}/output", http.StatusOK,
				action.Path(map[string]string{"task_id": "task_id"}, "offset", "limit")), Handle: by(subjects.ActionTaskOutput, o.task)},
		{Name: subjects.ActionTaskOutputAppend, IDField: "task_id", Access: action.Agent, Summary: "append to a running task's output",
			MaxBody: func() int64 { return subjects.MaxAppendBody }, Handle: by(subjects.ActionTaskOutputAppend, o.task)},
	}
}

func (o *Operations) notificationActions() []action.Action {
	return []action.Action{
		{Name: subjects.ActionNotify, Access: action.Agent, Summary: "notify the user (the console's bell), paced per agent",
			Handle: by(subjects.ActionNotify, o.notification)},
		{Name: subjects.ActionNotificationsCreate, Access: action.Operator, Summary: "create a notification for the agent (the console's form)",
			HTTPOnly: true, HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/notifications", http.StatusOK, nil),
			Handle: by(subjects.ActionNotificationsCreate, o.notification)},
		{Name: subjects.ActionNotificationsList, Access: action.Agent, Summary: "the agent's notification history, or the changes since a sequence",
			Columns: []string{"id", "type", "title", "message", "timestamp", "read"},
			HTTP:    action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/notifications", http.StatusOK, action.Query("since")), Handle: by(subjects.ActionNotificationsList, o.notification)},
		{Name: subjects.ActionNotificationsMark, Access: action.Operator, Summary: "mark notifications read",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/notifications/mark-read", http.StatusOK, nil), Handle: by(subjects.ActionNotificationsMark, o.notification)},
		{Name: subjects.ActionNotificationsClear, Access: action.Operator, Summary: "remove every notification of the agent",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/notifications/clear", http.StatusOK, nil), Handle: by(subjects.ActionNotificationsClear, o.notification)},
	}
}

func (o *Operations) inboxActions() []action.Action {
	return []action.Action{
		{Name: subjects.ActionInboxFetch, Access: action.Agent, Summary: "read the inbox reliably from the agent's cursor",
			HTTP: action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/inbox/fetch", http.StatusOK, action.Query("max", "after", "wait_ms")), Handle: by(subjects.ActionInboxFetch, o.doInbox)},
		{Name: subjects.ActionInboxAck, Access: action.Agent, Summary: "acknowledge the inbox up to a sequence, moving the cursor",
			HTTP: action.HTTPRoute(http.MethodPost, action.AgentRoutes+"/inbox/ack", http.StatusOK, nil), Handle: by(subjects.ActionInboxAck, o.doInbox)},
	}
}

// requestWait serves wait.request.
func (o *Operations) requestWait(ctx context.Context, r action.Request) (any, error) {
	spec, err := subjects.DecodeWaitRequest(r.Body, o.now(), o.tz)
	if err != nil {
		return nil, err
	}
	if !action.Replayed(ctx, o.waits.Get, r.AgentID, spec.Request.RequestID, subjects.WaitIDFor) {
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
