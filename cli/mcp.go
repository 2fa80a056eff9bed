package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"

	"github.com/chime-nats/chime/mcp"
	"github.com/chime-nats/chime/subjects"
)

// mcpStdio runs `chime mcp`: the agent's MCP server on standard input and
// output, for clients that launch their servers as processes. It carries
// each message to chime's HTTP endpoint for the agent, with the agent's
// token, so the tools, tasks and errors are exactly the HTTP server's.
func (a *App) mcpStdio(ctx context.Context, args []string) error {
	fs := newFlagSet(a, "mcp")
	agent := fs.String("agent", envOr("CHIME_AGENT_ID", "demo"), "agent ID")
	base := fs.String("url", envOr("CHIME_URL", "http://127.0.0.1:8080"), "chime's HTTP address (default CHIME_URL)")
	pos, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if len(pos) > 0 {
		return fmt.Errorf("%w: mcp: unexpected %q (see chime mcp --help)", ErrUsage, pos[0])
	}
	if err := subjects.ValidateID("agent", *agent); err != nil {
		return fmt.Errorf("%w: mcp: %w", ErrUsage, err)
	}
	u, err := url.Parse(*base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: mcp: --url must be http(s)://host:port, not %q", ErrUsage, *base)
	}
	token := a.token
	if t := os.Getenv("CHIME_TOKEN"); token == "" && t != "" {
		token = t
	}
	s := &mcp.Stdio{
		Endpoint: strings.TrimRight(u.String(), "/") + "/api/agents/" + *agent + "/mcp",
		Token:    token,
		Log:      slog.New(slog.NewTextHandler(a.Stderr, nil)),
	}
	return s.Run(ctx, os.Stdin, a.Stdout)
}
