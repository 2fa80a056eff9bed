package prompts_test

import (
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/chime-nats/chime/api"
	"github.com/chime-nats/chime/prompts"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/waits"
)

var (
	// agentSubject is a subject a prompt tells an agent to use.
	agentSubject = regexp.MustCompile("`agent\\.<your id>\\.([a-z_.<>]+)`")
	listed       = regexp.MustCompile("`([a-z_.]+)`")
)

// notServedYet are subjects prompts name that chime does not serve yet,
// each with the issue that serves it. An agent told to use one of them
// gets "no responders"; keep the list empty where you can.
var notServedYet = map[string]string{}

// TestPromptsNameServedSubjects: every subject a prompt tells an agent to
// request is served, or one chime publishes for the agent to read.
func TestPromptsNameServedSubjects(t *testing.T) {
	served := append(api.Rights().All, subjects.ActionInbox, waits.ActionWaitProgress)
	names, err := filepath.Glob("*.md")
	if err != nil || len(names) == 0 {
		t.Fatalf("prompts: %v", err)
	}
	seen := 0
	for _, name := range names {
		text, err := prompts.Get(filepath.Base(name))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(text, "\n") {
			for _, m := range agentSubject.FindAllStringSubmatch(line, -1) {
				actions := []string{m[1]}
				// "all to `agent.<your id>.timer.<action>`: `create`, `list`"
				if prefix, ok := strings.CutSuffix(m[1], ".<action>"); ok {
					_, rest, _ := strings.Cut(line, "`:")
					actions = nil
					for _, a := range listed.FindAllStringSubmatch(rest, -1) {
						actions = append(actions, prefix+"."+a[1])
					}
					if len(actions) == 0 {
						t.Errorf("%s: %q names no actions", name, line)
					}
				}
				for _, a := range actions {
					seen++
					if !slices.Contains(served, a) && notServedYet[a] == "" {
						t.Errorf("%s tells agents to use agent.<id>.%s, which chime does not serve", name, a)
					}
				}
			}
		}
	}
	if seen == 0 {
		t.Fatal("no subject found in the prompts: the pattern is stale")
	}
	for a := range notServedYet {
		if slices.Contains(served, a) {
			t.Errorf("%s is served now: take it off notServedYet", a)
		}
	}
}
