package subjects

import "strings"

// Internal event subjects (stored in the events stream).
const (
	TimerFire = "timer.fire"
)

// Agent-scoped actions: agent.<id>.<action>.
const (
	ActionTimerCreate = "timer.create"
	ActionTimerList   = "timer.list"
	ActionTimerGet    = "timer.get"
	ActionTimerCancel = "timer.cancel"
	ActionInbox       = "inbox"
)

// ServiceName is the micro service name every replica registers.
const ServiceName = "chime"

// QueueGroup is the queue group every replica's endpoints share.
const QueueGroup = "chime"

// Agent returns agent.<id>.<action>. The id must have passed ValidateID.
func Agent(id, action string) string { return "agent." + id + "." + action }

// Inbox returns the inbox subject of an agent.
func Inbox(id string) string { return Agent(id, ActionInbox) }

// AgentWildcard returns agent.*.<action>, the subject a replica serves.
func AgentWildcard(action string) string { return "agent.*." + action }

// InboxWildcard is the subject filter of the inbox stream.
const InboxWildcard = "agent.*.inbox"

// ParseAgent extracts and validates the agent ID of agent.<id>.<action...>.
func ParseAgent(subject string) (string, error) {
	rest, ok := strings.CutPrefix(subject, "agent.")
	if !ok {
		return "", &Error{Code: CodeInvalidID, Message: "subject " + subject + " is not an agent subject"}
	}
	id, _, _ := strings.Cut(rest, ".")
	if err := ValidateID("agent_id", id); err != nil {
		return "", err
	}
	return id, nil
}

// TimerKey is the KV key of a timer record: <agent>.<timer>.
func TimerKey(agentID, timerID string) string { return agentID + "." + timerID }

// ParseRecordKey splits the KV key of a timer or wait record,
// <agent>.<id>; ok is false for any other key.
func ParseRecordKey(key string) (agentID, id string, ok bool) {
	agentID, id, ok = strings.Cut(key, ".")
	if !ok || agentID == "" || id == "" || strings.Contains(id, ".") {
		return "", "", false
	}
	return agentID, id, true
}

// interventionApplyPrefix starts every agent's intervention event subject.
const interventionApplyPrefix = "intervention.apply."

// InterventionApply returns intervention.apply.<agent>, the subject of the
// agent's intervention events. The id must have passed ValidateID.
func InterventionApply(agentID string) string { return interventionApplyPrefix + agentID }

// ParseInterventionApply extracts and validates the agent ID of an
// intervention event's subject.
func ParseInterventionApply(subject string) (string, error) {
	id, ok := strings.CutPrefix(subject, interventionApplyPrefix)
	if !ok {
		return "", &Error{Code: CodeInvalidID, Message: "subject " + subject + " is not an intervention event"}
	}
	if err := ValidateID("agent_id", id); err != nil {
		return "", err
	}
	return id, nil
}

// Task settle work items, on the events stream: a message schedule per
// task (task.schedule.<agent>.<task>), stored before its result is, that
// the engine delivers when due as task.settle.<agent>.<task>, so that a
// replica delivers the result even if its reporter never comes back.
const (
	TaskScheduleAll = "task.schedule.>"
	TaskSettleAll   = "task.settle.>"
)

// TaskSchedule is the subject of a task's settle schedule.
func TaskSchedule(agentID, taskID string) string {
	return "task.schedule." + agentID + "." + taskID
}

// TaskSettle is where the engine delivers a task's due settle work item.
func TaskSettle(agentID, taskID string) string {
	return "task.settle." + agentID + "." + taskID
}

// ParseTaskSettle splits a settle work item's subject.
func ParseTaskSettle(subject string) (agentID, taskID string, err error) {
	rest, ok := strings.CutPrefix(subject, "task.settle.")
	if ok {
		agentID, taskID, ok = ParseRecordKey(rest)
	}
	if !ok {
		return "", "", Invalid("not a task settle subject: " + subject)
	}
	return agentID, taskID, nil
}

// Internal events of waits and interventions, in the events stream.
const (
	// WaitFire is the internal event of a wait reaching its target.
	WaitFire = "wait.fire"
	// InterventionApplyAll matches the internal events of accepted
	// interventions, intervention.apply.<agent>: one subject per agent, so
	// each agent's are applied in stream order without holding up others.
	InterventionApplyAll = "intervention.apply.*"
)

// Callback ingress over NATS: requests with the token in a header. They
// are never stored as sent: the token must not reach a stream.
const (
	CallbackWake    = "callback.wake"
	CallbackEnqueue = "callback.enqueue"
	// CallbackEventWake and CallbackEventEnqueue are the stored events of
	// accepted callbacks, without the token.
	CallbackEventWake    = "callback.event.wake"
	CallbackEventEnqueue = "callback.event.enqueue"

	HeaderCallbackToken  = "Chime-Callback-Token"
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderContentType    = "Content-Type"
)

// Internal subjects of WaitFor rechecks, in the WaitFor stream.
const (
	WaitForScheduleAll = "waitfor.schedule.>"
	WaitForRecheckAll  = "waitfor.recheck.>"
)

// WaitForSchedule is the schedule subject of a WaitFor's recheck.
func WaitForSchedule(agentID, waitID string) string {
	return "waitfor.schedule." + agentID + "." + waitID
}

// WaitForRecheck is where the engine delivers a WaitFor's due recheck.
func WaitForRecheck(agentID, waitID string) string {
	return "waitfor.recheck." + agentID + "." + waitID
}

// ParseWaitForRecheck splits a recheck subject.
func ParseWaitForRecheck(subject string) (agentID, waitID string, err error) {
	rest, ok := strings.CutPrefix(subject, "waitfor.recheck.")
	if ok {
		agentID, waitID, ok = ParseRecordKey(rest)
	}
	if !ok {
		return "", "", Invalid("not a recheck subject: " + subject)
	}
	return agentID, waitID, nil
}
