package monitors

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/subjects"
)

// CodeSubjectNotAllowed refuses a subject an agent may not watch.
const CodeSubjectNotAllowed = "monitor_subject_not_allowed"

// MaxSubjectLen bounds a watched subject.
const MaxSubjectLen = 256

// AgentPlaceholder in an allowed pattern stands for the watching agent's
// ID: "team.{agent}.>" lets each agent watch its own space.
const AgentPlaceholder = "{agent}"

// Denied returns the subjects no monitor may overlap, whatever the operator
// allows: every agent's subjects (inboxes, requests), callbacks, replies
// (which carry answers meant for one requester, tokens among them), and
// chime's own; the subjects of chime's streams are added by
// NewSubjectPolicy. A subject whose first token is a wildcard, or starts
// with $ (NATS's system, JetStream, KV and services) or _ (replies), is
// refused before these are looked at.
func Denied() []string { return []string{"agent.>", "callback.>", "chime.>", "_INBOX.>", "_R_.>"} }

// SubjectPolicy says which subjects an agent may watch: the subset of the
// operator's allowed patterns (CHIME_MONITOR_SUBJECTS) that overlaps
// nothing denied. The zero policy allows none.
type SubjectPolicy struct {
	allow  []string
	denied []string
}

// NewSubjectPolicy checks the operator's patterns against the denied
// subjects (internal: chime's stream subjects) and returns the policy.
// A pattern that would open a denied subject is an error, so that a
// mistake in the configuration fails at start rather than opening inboxes.
func NewSubjectPolicy(allow, internal []string) (SubjectPolicy, error) {
	p := SubjectPolicy{denied: append(Denied(), internal...)}
	for _, a := range allow {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		// The placeholder is one token: checked as an agent ID would be.
		if err := p.deny(strings.ReplaceAll(a, AgentPlaceholder, "x")); err != nil {
			return SubjectPolicy{}, fmt.Errorf("monitors: allowed subject %q: %w", a, err)
		}
		p.allow = append(p.allow, a)
	}
	return p, nil
}

// Allowed are the operator's patterns, as given.
func (p SubjectPolicy) Allowed() []string { return slices.Clone(p.allow) }

// deny returns why subject may not be watched by anyone, or nil.
func (p SubjectPolicy) deny(subject string) error {
	switch {
	case len(subject) > MaxSubjectLen:
		return subjects.Invalid(fmt.Sprintf("subject must be at most %d bytes", MaxSubjectLen))
	case strings.ContainsAny(subject, " \t\r\n") || !server.IsValidSubject(subject):
		return subjects.Invalid(fmt.Sprintf("subject %q is not a valid NATS subject", subject))
	}
	first, _, _ := strings.Cut(subject, ".")
	if first == "*" || first == ">" || strings.HasPrefix(first, "$") || strings.HasPrefix(first, "_") {
		return notAllowed(fmt.Sprintf("subject %s may match NATS's own subjects ($SYS, $JS, $KV, replies): its first token must be a name, not starting with $ or _", subject))
	}
	for _, d := range p.denied {
		if server.SubjectsCollide(subject, d) {
			return notAllowed(fmt.Sprintf("subject %s overlaps %s, which is chime's or every agent's own", subject, d))
		}
	}
	return nil
}

func notAllowed(msg string) *subjects.Error {
	return &subjects.Error{Code: CodeSubjectNotAllowed, Message: msg, Status: 403}
}

// Check returns why agentID may not watch subject, or nil: it must
// overlap nothing denied and lie wholly within one allowed pattern.
func (p SubjectPolicy) Check(agentID, subject string) error {
	if err := p.deny(subject); err != nil {
		return err
	}
	if len(p.allow) == 0 {
		return notAllowed("no subject is open to monitors here (CHIME_MONITOR_SUBJECTS is empty)")
	}
	for _, a := range p.allow {
		if server.SubjectMatchesFilter(subject, strings.ReplaceAll(a, AgentPlaceholder, agentID)) {
			return nil
		}
	}
	return notAllowed(fmt.Sprintf("subject %s is not within the subjects open to monitors (CHIME_MONITOR_SUBJECTS: %s)", subject, strings.Join(p.allow, ", ")))
}

// SubjectFeed watches a NATS subject on a core subscription of NC: each
// message is a line "<subject> <payload>". It keeps no cursor: what is
// published while no replica watches (a takeover) is not seen, and what
// arrives while the batches are behind by watchBuffer lines is dropped,
// counted as suppressed.
type SubjectFeed struct{ NC *nats.Conn }

// Run watches m's subject until ctx ends.
func (f SubjectFeed) Run(ctx context.Context, m *Monitor, sink *Sink) error {
	sub, err := f.NC.Subscribe(m.Source.Value, func(msg *nats.Msg) {
		// Cut here: a buffer of lines must not hold whole large payloads.
		sink.Offer(Item{Line: msg.Subject + " " + string(msg.Data[:min(len(msg.Data), 2*MaxLineBytes)])})
	})
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", m.Source.Value, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	<-ctx.Done()
	return nil
}
