package action

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Tool offers an action to MCP clients as a tool. The MCP server builds the
// tool's input schema and descriptions from the prompt, whose arguments a
// test holds to the request types, so an agent reads one text whichever
// surface it uses.
type Tool struct {
	// Name is the tool's name; empty is the action's name with _ for .
	// ("timer_create").
	Name string
	// Prompt is the prompts/ file that documents the action ("timers.md").
	Prompt string
	// Verb is the word the prompt's "required for <verb>" uses for this
	// action; empty is the action name's last part ("create").
	Verb string
	// Later follows an action whose outcome comes after its reply (a wait's
	// end, a question's answer): MCP then answers a client that takes tasks
	// with a task that follows the outcome. Nil: the reply is the outcome.
	Later Later
}

// ToolName is the name a's tool goes by.
func (a *Action) ToolName() string {
	if a.Tool != nil && a.Tool.Name != "" {
		return a.Tool.Name
	}
	return strings.ReplaceAll(a.Name, ".", "_")
}

// ToolVerb is the word a's prompt uses for a.
func (a *Action) ToolVerb() string {
	if a.Tool != nil && a.Tool.Verb != "" {
		return a.Tool.Verb
	}
	return a.Name[strings.LastIndex(a.Name, ".")+1:]
}

// Later follows the outcome of a call that ends after its reply. Each
// feature says how its records map to the four states, so that a task
// follows the record it stands for on any replica and after a restart.
type Later interface {
	// Pending names, from the call's reply, the record whose outcome comes
	// later; ok is false when the reply is already the outcome (a WaitFor
	// satisfied at once, or one that awaits the agent's report).
	Pending(reply any) (ref string, ok bool)
	// Outcome reads where the record stands now. A record that is gone
	// (expired) is an error wrapping a *subjects.Error with a not-found
	// code.
	Outcome(ctx context.Context, agentID, ref string) (Outcome, error)
	// Cancel asks for the record to end. Ending is cooperative: a record
	// that already ended keeps its outcome. A record that cannot be ended
	// returns ErrNotCancellable: the caller then only stops following it.
	Cancel(ctx context.Context, agentID, ref string) error
}

// ErrNotCancellable is a Later's Cancel of a record that cannot be ended
// (a question stays open until answered).
var ErrNotCancellable = errors.New("action: the record cannot be cancelled")

// Answerer is a Later whose record can need input (a question): Answer
// gives it, once; a record already answered is an error.
type Answerer interface {
	Answer(ctx context.Context, agentID, ref string, answers []string) error
}

// State is where a later call stands.
type State string

// The states of a later call. They are MCP's task statuses, which say what
// an agent needs to know: wait, answer, read the result, or give up.
const (
	Working    State = "working"
	NeedsInput State = "input_required"
	Done       State = "completed"
	Cancelled  State = "cancelled"
)

// Outcome is a later call's state.
type Outcome struct {
	State State
	// Message is one line on where it stands ("waiting until ...").
	Message string
	// Text is, once Done or Cancelled, the outcome in the words the inbox
	// envelope carries: self-contained, as a model may read only this.
	Text string
	// Data is the envelope's data, when Done or Cancelled.
	Data any
	// Questions are what a NeedsInput record asks, in order.
	Questions []Question
	// Updated is when the record last changed.
	Updated time.Time
	// Due, when known, is when a Working record is expected to end (a
	// wait's target): followers look then rather than on a fixed beat.
	Due time.Time
}

// Question is one question of a record that needs input.
type Question struct {
	Title   string
	Options []string // empty: free text
}

// ToolsMarkdown is the contract's table of MCP tools: each tool, the
// action it calls, whether it may answer with a task, and its prompt.
func (t *Table) ToolsMarkdown() string {
	var b strings.Builder
	b.WriteString("| tool | action (`agent.<id>.` + ) | answers with a task | prompt |\n|---|---|---|---|\n")
	for _, a := range t.list {
		if a.Tool == nil || a.Access != Agent || !a.OnNATS() {
			continue
		}
		task := "-"
		if a.Tool.Later != nil {
			task = "yes"
		}
		fmt.Fprintf(&b, "| `%s` | `%s` | %s | `prompts/%s` |\n", a.ToolName(), a.Name, task, a.Tool.Prompt)
	}
	return b.String()
}
