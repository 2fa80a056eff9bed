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
