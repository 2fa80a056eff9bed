package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/api"
	"github.com/chime-nats/chime/client"
)

// handWritten are the actions whose commands are written out in this
// package (friendlier flags, progress, follow): their generic form would
// clash with them.
var handWritten = []string{"timer.create", "timer.list", "timer.get", "timer.cancel", "question.list", "question.answer", "notify"}

// actionTable is every action chime serves (it needs no storage to read).
func actionTable() *action.Table { return api.NewOperations(api.Config{}).Table() }

// findAction returns the action whose words begin args, the longest such,
// and the arguments after them; nil when none does or its command is
// written out by hand.
func findAction(t *action.Table, args []string) (*action.Action, []string) {
	var best *action.Action
	for _, a := range t.All() {
		w := a.Words()
		if a.OnNATS() && len(w) <= len(args) && slices.Equal(w, args[:len(w)]) && (best == nil || len(w) > len(best.Words())) {
			best = a
		}
	}
	if best == nil || slices.Contains(handWritten, best.Name) {
		return nil, nil
	}
	return best, args[len(best.Words()):]
}

// runAction runs one action from its generic command line:
//
//	chime <words> [ID] [field=value ...] [--body JSON] [--agent ID] [--token T]
//
// A value that is valid JSON (a number, true, false, null, an array, an
// object, a quoted string) is sent as that; anything else as a string.
func (a *App) runAction(ctx context.Context, act *action.Action, args []string) error {
	name := "chime " + strings.Join(act.Words(), " ")
	fs := newFlagSet(a, name)
	agent := fs.String("agent", envOr("CHIME_AGENT_ID", "demo"), "agent ID")
	raw := fs.String("body", "", "the request body as JSON (fields given as field=value are added to it)")
	asJSON := new(bool)
	if act.Columns != nil {
		asJSON = fs.Bool("json", false, "print the JSON reply rather than a table (for scripts)")
	}
	fs.Usage = func() { a.actionHelp(a.Stdout, act) }
	pos, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	body := map[string]any{}
	if *raw != "" {
		if err := json.Unmarshal([]byte(*raw), &body); err != nil {
			return fmt.Errorf("%w: %s --body: not a JSON object: %w", ErrUsage, name, err)
		}
	}
	for _, p := range pos {
		field, value, ok := strings.Cut(p, "=")
		switch {
		case ok && field != "":
			body[field] = fieldValue(value)
		case act.IDField != "" && body[act.IDField] == nil:
			body[act.IDField] = p
		default:
			return fmt.Errorf("%w: %s: unexpected %q (fields are field=value; see %s --help)", ErrUsage, name, p, name)
		}
	}
	var req []byte
	if len(body) > 0 {
		if req, err = json.Marshal(body); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	columns := act.Columns
	if *asJSON {
		columns = nil
	}
	return a.requestShown(ctx, *agent, columns, func(ctx context.Context, c *client.Client) (any, error) {
		var out json.RawMessage
		if err := c.Request(ctx, act.Name, req, &out); err != nil {
			return nil, err
		}
		return out, nil
	})
}

// fieldValue reads a field=value's value: JSON when it is, else a string.
func fieldValue(v string) any {
	if json.Valid([]byte(v)) {
		return json.RawMessage(v)
	}
	return v
}

// actionHelp describes one action's command.
func (a *App) actionHelp(w io.Writer, act *action.Action) {
	words := strings.Join(act.Words(), " ")
	id := ""
	if act.IDField != "" {
		id = " " + strings.ToUpper(act.IDField)
	}
	fmt.Fprintf(w, "Usage: chime %s%s [field=value ...] [--body JSON] [--agent ID] [--token T]\n\n%s%s.\n\n",
		words, id, strings.ToUpper(act.Summary[:1]), act.Summary[1:])
	fmt.Fprintf(w, "Body: %s\nReply: %s\n\n", act.Body, act.Reply)
	fmt.Fprintf(w, "Requests agent.<id>.%s (who: %s)", act.Name, act.Access)
	if act.HTTP != nil {
		fmt.Fprintf(w, "; over HTTP %s", act.HTTP.Pattern())
	}
	fmt.Fprintf(w, ". The fields are the request's, as docs/contract.md describes them.\n")
}

// actionsUsage lists the commands of the actions not written out by hand.
func actionsUsage(w io.Writer, t *action.Table) {
	fmt.Fprint(w, "\nEvery action, from chime's action table (chime <command> --help for one):\n")
	for _, act := range t.All() {
		if !act.OnNATS() || slices.Contains(handWritten, act.Name) {
			continue
		}
		cmd := strings.Join(act.Words(), " ")
		if act.IDField != "" {
			cmd += " " + strings.ToUpper(act.IDField)
		}
		fmt.Fprintf(w, "  chime %-37s %s\n", cmd, act.Summary)
	}
}
