package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/questions"
)

// question runs `chime question list|answer`: an operator's view of an
// agent's questions, and its answers.
func (a *App) question(ctx context.Context, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return fmt.Errorf("%w: question needs a command: list or answer", ErrUsage)
	}
	sub, args := args[0], args[1:]
	fs := newFlagSet(a, "question "+sub)
	agent := fs.String("agent", envOr("CHIME_AGENT_ID", "demo"), "agent ID")
	all := fs.Bool("all", false, "answered questions too (list)")
	asJSON := fs.Bool("json", false, "print the JSON reply rather than a table (list)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	switch sub {
	case "list":
		if len(pos) != 0 {
			return fmt.Errorf("%w: question list takes no arguments", ErrUsage)
		}
		var columns []string
		if !*asJSON {
			columns = columnsOf(questions.ActionQuestionList)
		}
		return a.requestShown(ctx, *agent, columns, func(ctx context.Context, c *client.Client) (any, error) {
			return c.ListQuestions(ctx, *all)
		})
	case "answer":
		if len(pos) < 2 {
			return fmt.Errorf("%w: question answer needs a question ID and an answer per question title", ErrUsage)
		}
		return a.request(ctx, *agent, func(ctx context.Context, c *client.Client) (any, error) {
			return c.Answer(ctx, pos[0], pos[1:]...)
		})
	}
	return fmt.Errorf("%w: unknown question command %q", ErrUsage, sub)
}
