package agents

import "time"

// AgentState is the per-agent record (chime_agents bucket, key = agent ID):
// lifecycle, pause, and the wake hint awaiting the agent.
type AgentState struct {
	AgentID   string      `json:"agent_id"`
	Status    AgentStatus `json:"status,omitempty"` // empty: never started
	StartedAt *time.Time  `json:"started_at,omitempty"`
	StoppedAt *time.Time  `json:"stopped_at,omitempty"`
	PausedAt  *time.Time  `json:"paused_at,omitempty"`
	// PendingWake is the wake hint the agent has not consumed yet; further
	// wakes fold into it.
	PendingWake *PendingWake `json:"pending_wake,omitempty"`
	// LastInterventionSeq is the events stream sequence of the agent's
	// last intervention applied (or given up): the next one in stream
	// order after it is the only one that may apply.
	LastInterventionSeq uint64 `json:"last_intervention_seq,omitempty"`
	// InterventionEpoch names the events stream the cursor counts in (its
	// creation time, Unix nanoseconds): a stream made anew restarts its
	// sequences, and an old cursor would skip the new interventions.
	InterventionEpoch int64 `json:"intervention_epoch,omitempty"`
	// InboxAcked is the agent's inbox cursor (inbox.ack): the last inbox
	// stream sequence it has handled; a fetch starts after it.
	InboxAcked uint64 `json:"inbox_acked,omitempty"`
}

// PendingWake is a delivered (or in-flight) wake hint.
type PendingWake struct {
	EventID string `json:"event_id"`
	// InboxSeq is its inbox stream sequence once stored; 0 while in flight.
	InboxSeq  uint64    `json:"inbox_seq,omitempty"`
	ClaimedAt time.Time `json:"claimed_at"`
}

// InboxConsumer is the durable consumer name an agent reads its inbox
// with, acking what it has handled: chime counts a wake hint as consumed
// once this consumer's ack floor passes it. An agent without one never has
// a wake hint pending, so each wake is delivered.
func InboxConsumer(agentID string) string { return "inbox-" + agentID }

// Agent token actions: operators issue and revoke an agent's NATS and
// HTTP tokens.
const (
	ActionTokenIssue  = "token.issue"
	ActionTokenRevoke = "token.revoke"
)

// AgentSummary is one agent in the operators' agent list.
type AgentSummary struct {
	AgentID  string      `json:"agent_id"`
	Status   AgentStatus `json:"status,omitempty"` // empty: never started
	PausedAt *time.Time  `json:"paused_at,omitempty"`
	// Deliveries is how many envelopes its inbox stream holds.
	Deliveries uint64 `json:"deliveries"`
	// Notifications is how many notifications it has, Unread how many
	// of them are unread.
	Notifications int `json:"notifications"`
	Unread        int `json:"unread"`
}

// ListAgentsReply is the agent list, by ID.
type ListAgentsReply struct {
	Agents []AgentSummary `json:"agents"`
}

// AgentStatus is an agent's lifecycle state.
type AgentStatus string

// Agent statuses; an agent never started is neither.
const (
	AgentActive  AgentStatus = "active"
	AgentStopped AgentStatus = "stopped"
)
