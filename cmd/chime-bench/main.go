// Command chime-bench holds chime's benchmarks and fault drivers (timers,
// waits, callbacks, chaos, scale, inbox, soak, ...), kept out of the chime
// server binary. The benches that run chime replicas as processes run the
// chime binary beside this one, else chime on PATH, or --exe.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
)

// errUsage marks a command line that could not be understood.
var errUsage = errors.New("usage")

// app is the command line with its streams, so tests can run it in-process.
type app struct {
	Stdout, Stderr io.Writer
}

func main() {
	a := &app{Stdout: os.Stdout, Stderr: os.Stderr}
	if err := a.run(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "chime-bench:", err)
		if errors.Is(err, errUsage) {
			os.Exit(2) // the command line, not the benchmark, was wrong
		}
		os.Exit(1)
	}
}

func (a *app) run(ctx context.Context, args []string) error {
	if len(args) == 1 {
		switch args[0] {
		case "help", "-h", "--help":
			fmt.Fprintln(a.Stdout, "usage:", benchUsage)
			return nil
		}
	}
	return a.bench(ctx, args)
}
