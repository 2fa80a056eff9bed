package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/chime-nats/chime/subjects"
)

// agent runs `chime agent start|stop [--agent ID]`.
func (a *App) agent(ctx context.Context, args []string) error {
	if len(args) == 0 || (args[0] != "start" && args[0] != "stop") {
		return fmt.Errorf("%w: chime agent start|stop [--agent ID]", ErrUsage)
	}
	sub := args[0]
	fs := newFlagSet(a, "agent "+sub)
	agent := fs.String("agent", envOr("CHIME_AGENT_ID", "demo"), "agent ID")
	if pos, err := parseInterspersed(fs, args[1:]); err != nil || len(pos) != 0 {
		return fmt.Errorf("%w: chime agent %s [--agent ID]", ErrUsage, sub)
	}
	c, closeConn, err := agentClient(*agent)
	if err != nil {
		return err
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var res any
	if sub == "start" {
		res, err = c.Start(ctx)
	} else {
		res, err = c.Stop(ctx)
	}
	if err != nil {
		return err
	}
	return a.printJSON(res)
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
	c, closeConn, err := agentClient(*agent)
	if err != nil {
		return err
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var res any
	switch {
	case sub == "reset" && len(pos) == 0:
		res, err = c.ResetCallback(ctx, subjects.DeliveryMode(*mode))
	case sub == "create" && len(pos) == 0:
		res, err = c.CreateTrigger(ctx, subjects.DeliveryMode(*mode), *label)
	case sub == "cancel" && len(pos) == 1:
		res, err = c.CancelTrigger(ctx, pos[0])
	case sub == "list" && len(pos) == 0:
		res, err = c.ListTriggers(ctx)
	default:
		return fmt.Errorf("%w: %s", ErrUsage, callbackUsage)
	}
	if err != nil {
		return err
	}
	return a.printJSON(res)
}

func (a *App) printJSON(v any) error {
	enc := json.NewEncoder(a.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
