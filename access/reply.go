package access

import (
	"strings"

	"github.com/chime-nats/chime/subjects"
)

// A request's reply subject is chosen by whoever sends it, and chime's
// answer is published there. If chime answered anywhere, any principal
// could make chime write into another's lane: into an inbox, a request
// subject, a KV bucket. So chime answers only on the inbox of a principal
// that may have sent the request: the agent's own (_INBOX.agent.<id>.),
// the callback token's (_INBOX.callback.<trigger>.), or an operator's
// (_INBOX.<x>. where <x> names neither an agent nor a callback). The
// connection that publishes the answers may publish nowhere but _INBOX.>,
// so the server holds the same line if this check ever slips.

// ServiceInboxPrefix is the inbox prefix of chime's own connections: no
// principal may subscribe to it (operators may subscribe to _INBOX.>), and
// no reply is ever answered into it, so no one can read or forge the
// replies chime's own requests (JetStream API, KV) get.
const ServiceInboxPrefix = "_CHIME_INBOX"

// ReplyPrefix is the common prefix of every principal's inbox.
const ReplyPrefix = "_INBOX."

// AgentReplyAllowed reports whether chime may answer a request to one of
// agentID's subjects on reply: the agent's own inbox, or an operator's.
// Who may send which action is the server's to enforce (Permissions); an
// operator acting for the agent may use the agent's inbox prefix too.
func AgentReplyAllowed(agentID, reply string) bool {
	if !replySubject(reply) {
		return false
	}
	return strings.HasPrefix(reply, AgentInboxPrefix(agentID)+".") || operatorReply(reply)
}

// CallbackReplyAllowed reports whether chime may answer a callback request
// on reply. triggerID is the trigger of the token presented, or empty when
// the token names none (unknown, revoked): the sender is then some callback
// holder or an operator, and only an inbox of that shape is answered.
func CallbackReplyAllowed(triggerID, reply string) bool {
	if !replySubject(reply) {
		return false
	}
	if operatorReply(reply) {
		return true
	}
	prefix := callbackInboxPrefix + "."
	if triggerID != "" {
		return strings.HasPrefix(reply, prefix+triggerID+".")
	}
	rest, ok := strings.CutPrefix(reply, prefix)
	trigger, _, ok2 := strings.Cut(rest, ".")
	return ok && ok2 && trigger != ""
}

// callbackInboxPrefix heads the inboxes of callback senders.
const callbackInboxPrefix = ReplyPrefix + "callback"

// operatorReply is an inbox of the operators' shape: under _INBOX., and
// naming neither an agent's nor a callback's inbox.
func operatorReply(reply string) bool {
	rest, ok := strings.CutPrefix(reply, ReplyPrefix)
	if !ok {
		return false
	}
	first, _, _ := strings.Cut(rest, ".")
	return first != "" && first != "agent" && first != "callback"
}

// replySubject is a subject chime can publish to: non-empty tokens, no
// wildcards, no whitespace.
func replySubject(s string) bool {
	if s == "" || len(s) > 512 {
		return false
	}
	for _, tok := range strings.Split(s, ".") {
		if tok == "" || tok == "*" || tok == ">" {
			return false
		}
	}
	return !strings.ContainsAny(s, " \t\r\n*>")
}

// ResponderPublish is where chime's responder connection may publish: the
// principals' inboxes, nothing else.
func ResponderPublish() []string { return []string{ReplyPrefix + ">"} }

// ResponderSubscribe is what chime's responder connection serves: every
// request subject of every principal, and micro's discovery ($SRV).
func ResponderSubscribe(rights Rights) []string {
	var subs []string
	for _, a := range rights.All {
		subs = append(subs, subjects.AgentWildcard(a))
	}
	return append(subs, subjects.CallbackWake, subjects.CallbackEnqueue, "$SRV.>")
}
