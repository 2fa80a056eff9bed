// Command chime runs chime and talks to it; see the cli package.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/chime-nats/chime/cli"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.0.0-dev"

func main() {
	app := &cli.App{Stdout: os.Stdout, Stderr: os.Stderr, Version: version}
	if err := app.Run(context.Background(), os.Args[1:]); err != nil {
		var exit *cli.ExitError
		if errors.As(err, &exit) {
			os.Exit(exit.Code) // the command's own status: it has spoken for itself
		}
		if (!errors.Is(err, cli.ErrUsage) || err.Error() != cli.ErrUsage.Error()) && !errors.Is(err, cli.ErrInterrupted) {
			fmt.Fprintln(os.Stderr, "chime:", err)
		}
		if errors.Is(err, cli.ErrInterrupted) {
			os.Exit(130) // as a shell reports a Ctrl-C
		}
		if errors.Is(err, cli.ErrUsage) {
			os.Exit(2) // the command line, not the operation, was wrong
		}
		os.Exit(1)
	}
}
