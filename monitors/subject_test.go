package monitors_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/monitors"
	"github.com/chime-nats/chime/subjects"
)

// TestSubjectPolicyRefusesWhatIsNotTheAgents: thinking as an attacker, an
// agent names subjects that would show it another agent's inbox or
// requests, NATS's system and JetStream traffic, replies, or chime's
// internals, directly or through wildcards: each is refused, with the
// operator allowing wide patterns; what the operator allows is watched.
func TestSubjectPolicyRefusesWhatIsNotTheAgents(t *testing.T) {
	p, err := monitors.NewSubjectPolicy([]string{"ci.>", " team.{agent}.> ", "metrics.*.cpu", ""}, engine.InternalSubjects())
	if err != nil {
		t.Fatal(err)
	}
	for _, ok := range []string{"ci.build", "ci.>", "ci.*.status", "team.a1.x", "team.a1.>", "metrics.host1.cpu", "metrics.*.cpu"} {
		if err := p.Check("a1", ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, tc := range []struct{ subject, code, text string }{
		{"agent.a2.inbox", monitors.CodeSubjectNotAllowed, "overlaps agent.>"},
		{"agent.a1.inbox", monitors.CodeSubjectNotAllowed, "overlaps agent.>"},
		{"agent.*.inbox", monitors.CodeSubjectNotAllowed, "overlaps agent.>"},
		{"agent.>", monitors.CodeSubjectNotAllowed, "overlaps agent.>"},
		{"*.a2.inbox", monitors.CodeSubjectNotAllowed, "first token"},
		{">", monitors.CodeSubjectNotAllowed, "first token"},
		{"*.>", monitors.CodeSubjectNotAllowed, "first token"},
		{"$JS.API.>", monitors.CodeSubjectNotAllowed, "first token"},
		{"$SYS.>", monitors.CodeSubjectNotAllowed, "first token"},
		{"$KV.chime_tokens.>", monitors.CodeSubjectNotAllowed, "first token"},
		{"$SYS.REQ.USER.AUTH", monitors.CodeSubjectNotAllowed, "first token"},
		{"_INBOX.>", monitors.CodeSubjectNotAllowed, "first token"},
		{"_INBOX.abc.def", monitors.CodeSubjectNotAllowed, "first token"},
		{"callback.wake", monitors.CodeSubjectNotAllowed, "overlaps callback.>"},
		{"chime.revoked", monitors.CodeSubjectNotAllowed, "overlaps chime.>"},
		{"intervention.apply.a2", monitors.CodeSubjectNotAllowed, "overlaps intervention.apply."},
		{"task.settle.>", monitors.CodeSubjectNotAllowed, "overlaps task.settle.>"},
		{"wait.fire", monitors.CodeSubjectNotAllowed, "overlaps wait.fire"},
		{"waitfor.>", monitors.CodeSubjectNotAllowed, "overlaps waitfor."},
		{"history.timer.a2.x", monitors.CodeSubjectNotAllowed, "overlaps history.timer.>"},
		{"team.a2.>", monitors.CodeSubjectNotAllowed, "not within the subjects open to monitors"},
		{"team.*.x", monitors.CodeSubjectNotAllowed, "not within"},
		{"team.>", monitors.CodeSubjectNotAllowed, "not within"},
		{"metrics.>", monitors.CodeSubjectNotAllowed, "not within"},
		{"cix.build", monitors.CodeSubjectNotAllowed, "not within"},
		{"ci..build", subjects.CodeInvalidRequest, "not a valid NATS subject"},
		{"ci.bu ild", subjects.CodeInvalidRequest, "not a valid NATS subject"},
		{"ci.>.x", subjects.CodeInvalidRequest, "not a valid NATS subject"},
		{"ci." + strings.Repeat("x", 300), subjects.CodeInvalidRequest, "at most 256 bytes"},
	} {
		err := p.Check("a1", tc.subject)
		var wire *subjects.Error
		if !errors.As(err, &wire) || wire.Code != tc.code || !strings.Contains(wire.Message, tc.text) {
			t.Errorf("%s: %v, want %s %q", tc.subject, err, tc.code, tc.text)
		}
	}
	// No pattern allowed: nothing is.
	none, _ := monitors.NewSubjectPolicy(nil, engine.InternalSubjects())
	if err := none.Check("a1", "ci.build"); err == nil || !strings.Contains(err.Error(), "CHIME_MONITOR_SUBJECTS is empty") {
		t.Fatalf("the zero policy: %v", err)
	}
	// An operator's pattern that would open what is denied fails at start.
	for _, bad := range []string{">", "agent.>", "agent.{agent}.inbox", "$JS.>", "_INBOX.>", "*.inbox", "task.>", "ci..x"} {
		if _, err := monitors.NewSubjectPolicy([]string{bad}, engine.InternalSubjects()); err == nil {
			t.Errorf("allowed pattern %q accepted", bad)
		}
	}
}
