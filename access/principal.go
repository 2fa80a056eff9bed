package access

import (
	"slices"

	"github.com/nats-io/jwt/v2"

	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/notifications"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/waits"
)

// Kind is a kind of principal.
type Kind string

// The principals a token can name.
const (
	KindAgent    Kind = "agent"
	KindOperator Kind = "operator"
	// KindCallback is an external system holding one callback token: it
	// may only call back.
	KindCallback Kind = "callback"
)

// Principal is who a connection or a request speaks for.
type Principal struct {
	Kind Kind
	// AgentID is the agent's own ID (KindAgent) or the agent the callback
	// token reaches (KindCallback).
	AgentID string
	// TriggerID is the callback token's trigger (KindCallback).
	TriggerID string
}

// Name says who the principal is, without any secret: "agent:alice",
// "operator", "callback:<trigger>".
func (p Principal) Name() string {
	switch p.Kind {
	case KindAgent:
		return "agent:" + p.AgentID
	case KindCallback:
		return "callback:" + p.TriggerID
	}
	return string(p.Kind)
}

// InboxPrefix is where the principal's request replies must come back: a
// client connects with it as its inbox prefix (nats.CustomInboxPrefix, the
// nats CLI's --inbox-prefix), so no principal can read another's replies.
// Operators may use any reply subject under _INBOX.
func (p Principal) InboxPrefix() string {
	switch p.Kind {
	case KindAgent:
		return AgentInboxPrefix(p.AgentID)
	case KindCallback:
		return callbackInboxPrefix + "." + p.TriggerID
	}
	return "_INBOX"
}

// AgentInboxPrefix is the reply prefix of agentID's connections.
func AgentInboxPrefix(agentID string) string { return ReplyPrefix + "agent." + agentID }

// Rights are the actions principals may request, from the action table:
// an agent its own subjects' agent actions, an operator every action of
// any agent.
type Rights struct {
	Agent, All []string
}

// RightsOf reads the rights from the action table, sorted so that the
// configurations written from them do not change with the table's order.
func RightsOf(t *action.Table) Rights {
	r := Rights{Agent: t.Names(action.Agent), All: t.Names(action.Operator)}
	slices.Sort(r.Agent)
	slices.Sort(r.All)
	return r
}

// agentReads are the agent's subjects it may subscribe to.
var agentReads = []string{subjects.ActionInbox, waits.ActionWaitProgress, notifications.ActionNotifications}

// Permissions are exactly the principal's NATS rights. Nothing else is
// allowed: not the internal subjects, not publishing into any inbox, not
// $KV, and no JetStream API at all. A JetStream request writes its answer,
// and a consumer its messages, to a subject the requester names (a reply,
// a deliver subject) with the stream's own rights, so any JetStream right
// would let a principal write into chime's buckets: agents and operators
// read inboxes through chime instead (inbox.fetch, inbox.ack, HTTP).
func (p Principal) Permissions(rights Rights) jwt.Permissions {
	var perm jwt.Permissions
	switch p.Kind {
	case KindAgent:
		for _, a := range rights.Agent {
			perm.Pub.Allow.Add(subjects.Agent(p.AgentID, a))
		}
		for _, r := range agentReads {
			perm.Sub.Allow.Add(subjects.Agent(p.AgentID, r))
		}
	case KindOperator:
		for _, a := range rights.All {
			perm.Pub.Allow.Add(subjects.AgentWildcard(a))
		}
		perm.Pub.Allow.Add(subjects.CallbackWake, subjects.CallbackEnqueue)
		perm.Pub.Allow.Add("$SRV.>")
		for _, r := range agentReads {
			perm.Sub.Allow.Add(subjects.AgentWildcard(r))
		}
	case KindCallback:
		perm.Pub.Allow.Add(subjects.CallbackWake, subjects.CallbackEnqueue)
	}
	perm.Sub.Allow.Add(p.InboxPrefix() + ".>")
	return perm
}
