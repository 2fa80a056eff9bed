package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/client"
)

// agent runs `chime agent start|stop [--agent ID]`.
func (a *App) agent(ctx context.Context, args []string) error {
	if len(args) == 0 || (args[0] != "start" && args[0] != "stop" && args[0] != "token") {
		return fmt.Errorf("%w: chime agent start|stop|token [--revoke] [--agent ID]", ErrUsage)
	}
	sub := args[0]
	fs := newFlagSet(a, "agent "+sub)
	agent := fs.String("agent", envOr("CHIME_AGENT_ID", "demo"), "agent ID")
	revoke := fs.Bool("revoke", false, "revoke every token of the agent instead (token)")
	if pos, err := parseInterspersed(fs, args[1:]); err != nil || len(pos) != 0 || (*revoke && sub != "token") {
		return fmt.Errorf("%w: chime agent %s [--agent ID]", ErrUsage, sub)
	}
	return a.request(ctx, *agent, func(ctx context.Context, c *client.Client) (any, error) {
		switch {
		case sub == "start":
			return c.Start(ctx)
		case sub == "stop":
			return c.Stop(ctx)
		case *revoke:
			return c.RevokeTokens(ctx)
		}
		// The token is printed once, to the operator who asked for it.
		return c.IssueToken(ctx)
	})
}

const callbackUsage = "chime callback reset|create [--mode wake_hint|enqueue_message] [--label L] | cancel ID | list [--agent ID]"

// callback runs `chime callback reset|create|cancel|list`. Issued URLs are
// printed once, to the caller: chime keeps only their hashes.
func (a *App) callback(ctx context.Context, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return fmt.Errorf("%w: %s", ErrUsage, callbackUsage)
	}
	sub := args[0]
	fs := newFlagSet(a, "callback "+sub)
	agent := fs.String("agent", envOr("CHIME_AGENT_ID", "demo"), "agent ID")
	mode := fs.String("mode", "", "delivery mode: wake_hint (default) or enqueue_message (reset, create)")
	label := fs.String("label", "", "a label for the trigger (create)")
	pos, err := parseInterspersed(fs, args[1:])
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	return a.request(ctx, *agent, func(ctx context.Context, c *client.Client) (any, error) {
		switch {
		case sub == "reset" && len(pos) == 0:
			return c.ResetCallback(ctx, callbacks.DeliveryMode(*mode))
		case sub == "create" && len(pos) == 0:
			return c.CreateTrigger(ctx, callbacks.DeliveryMode(*mode), *label)
		case sub == "cancel" && len(pos) == 1:
			return c.CancelTrigger(ctx, pos[0])
		case sub == "list" && len(pos) == 0:
			return c.ListTriggers(ctx)
		}
		return nil, fmt.Errorf("%w: %s", ErrUsage, callbackUsage)
	})
}

func (a *App) printJSON(v any) error {
	enc := json.NewEncoder(a.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
