// Package action is chime's table of actions. Each feature package
// declares its actions once: the name (the subject's last part,
// agent.<id>.<name>), a one-line summary, who may call it, its body limit,
// its HTTP route, and its handler. Every surface is then derived from one
// list. The NATS micro endpoints, the HTTP routes and the NATS rights the
// auth callout grants all come from it, as do the CLI's generic commands
// and the contract's tables (which a test checks against it). Adding an
// action is one declaration in its feature's package.
package action

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/chime-nats/chime/subjects"
)

// Access says who may call an action.
type Access int

const (
	// Agent actions may be called by the agent on its own subjects and
	// routes, and by an operator on any agent's.
	Agent Access = iota + 1
	// Operator actions may be called by operators only.
	Operator
)

func (a Access) String() string {
	switch a {
	case Agent:
		return "agent"
	case Operator:
		return "operator"
	}
	return fmt.Sprintf("Access(%d)", int(a))
}

// DefaultMaxBody bounds a request's body when its action names no limit
// (64 KiB, the contract's request limit).
const DefaultMaxBody = 64 << 10

// Request is one call of an action, from either surface.
type Request struct {
	// Surface is "nats" or "http".
	Surface string
	// AgentID is the agent the call is for: the <id> of its subject or
	// route, validated before the handler runs.
	AgentID string
	// Body is the request's JSON body, within the action's limit (an
	// HTTP route's Body has made it from the path and query).
	Body []byte
}

// Handler serves one call. It returns the reply value or an error that
// is, or wraps, a *subjects.Error for the caller to read.
type Handler func(ctx context.Context, r Request) (any, error)

// Route is an action's HTTP route.
type Route struct {
	// Method and Path are the route's pattern, as net/http reads it:
	// Path has {id} for the agent and may have more path values. Operator
	// routes live under /api/control/, agents' under /api/agents/.
	Method, Path string
	// Status is the status of a successful reply.
	Status int
	// Body makes the action's request body from the HTTP request and the
	// body read; nil passes the body as it was sent.
	Body func(r *http.Request, read []byte) []byte
}

// Pattern is the route's net/http pattern.
func (r Route) Pattern() string { return r.Method + " " + r.Path }

// Action is one declared action.
type Action struct {
	// Name is the subject's last part: agent.<id>.<Name>.
	Name string
	// Summary says in one line what the action does (the micro endpoint's
	// description, the CLI's help, the contract's table).
	Summary string
	// Body and Reply say, in the contract's shorthand, what the request
	// carries ("{timer_id}", "empty or {}") and what the reply is ("timer
	// record"); the feature's section of the contract has the detail.
	Body, Reply string
	Access      Access
	// MaxBody returns the most bytes a request body may have; nil is
	// DefaultMaxBody. It is a function because some limits follow the
	// configuration (an intervention's text may be as long as the inbox
	// can carry).
	MaxBody func() int64
	// HTTP is the action's route; nil serves it over NATS only.
	HTTP *Route
	// HTTPOnly keeps the action off NATS (a route shaped for the console).
	HTTPOnly bool
	// Command is the CLI's words for the action (`chime <Command>`), when
	// not the name's parts ("task get" for task.get).
	Command string
	// IDField is the body field the CLI's first positional argument
	// fills ("task_id" for `chime task get ID`); empty takes none.
	IDField string
	// Columns are the fields of each listed record a CLI table shows, for
	// an action whose reply lists records; nil: the CLI prints the JSON.
	Columns []string
	// Tool offers the action to MCP clients; nil keeps it off MCP.
	Tool   *Tool
	Handle Handler
}

// Changes reports whether the action may change something: it is not
// served by a GET, nor named a get, list, next or output read.
func (a *Action) Changes() bool {
	if a.HTTP != nil {
		return a.HTTP.Method != http.MethodGet
	}
	last := a.Name[strings.LastIndex(a.Name, ".")+1:]
	return !slices.Contains([]string{"get", "list", "next", "output"}, last)
}

// Words are the CLI's words for the action.
func (a *Action) Words() []string {
	if a.Command != "" {
		return strings.Fields(a.Command)
	}
	return strings.Split(a.Name, ".")
}

// Limit is the most bytes a's request body may have.
func (a *Action) Limit() int64 {
	if a.MaxBody == nil {
		return DefaultMaxBody
	}
	return a.MaxBody()
}

// OnNATS reports whether the action is served over NATS.
func (a *Action) OnNATS() bool { return !a.HTTPOnly }

// ErrDuplicate is returned by NewTable for two actions of one name.
var ErrDuplicate = errors.New("action: declared twice")

// Table is every action, in the order declared.
type Table struct {
	list   []*Action
	byName map[string]*Action
}

// NewTable lists the features' actions, in the order given.
func NewTable(features ...[]Action) (*Table, error) {
	t := &Table{byName: map[string]*Action{}}
	for _, f := range features {
		for i := range f {
			a := &f[i]
			if err := a.check(); err != nil {
				return nil, err
			}
			if _, dup := t.byName[a.Name]; dup {
				return nil, fmt.Errorf("%w: %s", ErrDuplicate, a.Name)
			}
			t.byName[a.Name] = a
			t.list = append(t.list, a)
		}
	}
	return t, nil
}

func (a *Action) check() error {
	switch {
	case a.Name == "" || strings.ContainsAny(a.Name, " *>\t\r\n") || strings.HasPrefix(a.Name, ".") || strings.HasSuffix(a.Name, "."):
		return fmt.Errorf("action: bad name %q", a.Name)
	case a.Access != Agent && a.Access != Operator:
		return fmt.Errorf("action %s: no access", a.Name)
	case a.Handle == nil:
		return fmt.Errorf("action %s: no handler", a.Name)
	case a.HTTPOnly && a.HTTP == nil:
		return fmt.Errorf("action %s: HTTP only with no route", a.Name)
	case a.HTTP != nil && !strings.Contains(a.HTTP.Path, "{id}"):
		return fmt.Errorf("action %s: route %s names no agent {id}", a.Name, a.HTTP.Pattern())
	}
	return nil
}

// Lookup returns the action of this name.
func (t *Table) Lookup(name string) (*Action, bool) {
	a, ok := t.byName[name]
	return a, ok
}

// All returns every action, in the order declared.
func (t *Table) All() []*Action { return slices.Clone(t.list) }

// Names returns the names of the actions served over NATS that access
// may call: Agent gives the agents' actions, Operator every action (an
// operator may call all of them).
func (t *Table) Names(access Access) []string {
	var out []string
	for _, a := range t.list {
		if a.OnNATS() && (access == Operator || a.Access == access) {
			out = append(out, a.Name)
		}
	}
	return out
}

// Markdown is the table's reference in the contract: one row per action
// with its subject, who may call it, its HTTP route and its summary.
func (t *Table) Markdown() string {
	var b strings.Builder
	b.WriteString("| subject (`agent.<id>.` + ) | who | body | reply | HTTP route (status) | what it does |\n|---|---|---|---|---|---|\n")
	for _, a := range t.list {
		subject := "`" + a.Name + "`"
		if !a.OnNATS() {
			subject = "(HTTP only)"
		}
		httpRoute := "-"
		if a.HTTP != nil {
			httpRoute = fmt.Sprintf("`%s` (%d)", a.HTTP.Pattern(), a.HTTP.Status)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", subject, a.Access, codeShapes(a.Body), codeShapes(a.Reply), httpRoute, a.Summary)
	}
	return b.String()
}

// codeShapes sets a body's or reply's JSON shape in code and leaves words as they are
// ("timer record", "{ok, question}").
func codeShapes(reply string) string {
	if strings.HasPrefix(reply, "{") {
		if i := strings.LastIndex(reply, "}"); i >= 0 {
			return "`" + reply[:i+1] + "`" + reply[i+1:]
		}
	}
	return reply
}

// Replayed reports whether a create that names requestID (its caller's
// key for retries) is already stored under idFor's ID: the store's create
// then answers it (the record, or a conflict) and creates nothing, so no
// quota or rate may stand in its way.
func Replayed[T any](ctx context.Context, get func(ctx context.Context, agentID, id string) (*T, error), agentID, requestID string, idFor func(agentID, requestID string) string) bool {
	if requestID == "" {
		return false
	}
	_, err := get(ctx, agentID, idFor(agentID, requestID))
	return err == nil
}

// Where routes live: agents' reads under AgentRoutes, operators' writes
// under ControlRoutes (the HTTP guard tells them apart by that).
const (
	AgentRoutes   = "/api/agents/{id}"
	ControlRoutes = "/api/control/agents/{id}"
)

// HTTPRoute is a route for an action's declaration.
func HTTPRoute(method, path string, status int, body func(*http.Request, []byte) []byte) *Route {
	return &Route{Method: method, Path: path, Status: status, Body: body}
}

// When is h where the feature it serves runs on this replica (ok), and
// otherwise a handler that answers unavailable with the message off
// ("tasks are not configured"): the table lists every action either way.
func When(ok bool, off string, h Handler) Handler {
	if ok {
		return h
	}
	return func(context.Context, Request) (any, error) {
		return nil, &subjects.Error{Code: subjects.CodeUnavailable, Message: off}
	}
}
