package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
)

// TestUsage: no bench, or an unknown one, is a usage error naming every
// bench; --help prints the same list and succeeds.
func TestUsage(t *testing.T) {
	benches := []string{"timers", "waits", "callbacks", "connect", "history", "waitfor", "notify", "notify-memory",
		"chaos", "scale", "capacity", "tasks", "inbox", "soak", "mcp", "monitor"}
	for _, args := range [][]string{nil, {"nope"}} {
		var stdout, stderr bytes.Buffer
		err := (&app{Stdout: &stdout, Stderr: &stderr}).run(context.Background(), args)
		if !errors.Is(err, errUsage) {
			t.Fatalf("chime-bench %v: %v, want a usage error", args, err)
		}
		for _, b := range benches {
			if !strings.Contains(err.Error(), "chime-bench "+b+" ") {
				t.Errorf("chime-bench %v: the usage does not name %s", args, b)
			}
		}
	}
	var stdout bytes.Buffer
	if err := (&app{Stdout: &stdout, Stderr: &stdout}).run(context.Background(), []string{"--help"}); err != nil {
		t.Fatalf("chime-bench --help: %v", err)
	}
	if !strings.HasPrefix(stdout.String(), "usage: chime-bench timers") {
		t.Errorf("chime-bench --help printed %q", stdout.String())
	}
}

// TestBadFlag: a flag a bench does not know is a usage error, before
// anything runs.
func TestBadFlag(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := (&app{Stdout: &stdout, Stderr: &stderr}).run(context.Background(), []string{"chaos", "--no-such-flag"})
	if !errors.Is(err, errUsage) {
		t.Fatalf("chime-bench chaos --no-such-flag: %v, want a usage error", err)
	}
}
