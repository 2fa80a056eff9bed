package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The server binary must not carry the benchmarks or the browser tests, and
// the public client (which agents link) must not carry the server: these
// are the module graph's two promises, and an import added in the wrong
// package breaks them silently.
func TestLinkedPackages(t *testing.T) {
	for _, c := range []struct {
		pkg       string
		forbidden []string
	}{
		{"github.com/chime-nats/chime/cmd/chime", []string{
			"github.com/chime-nats/chime/bench",
			"github.com/chime-nats/chime/cmd/chime-bench",
			"github.com/chime-nats/chime/internal/natsproc",
			"github.com/chromedp/",
		}},
		{"github.com/chime-nats/chime/client", []string{
			"github.com/nats-io/nats-server/",
			"github.com/chime-nats/chime/engine",
			"github.com/chime-nats/chime/replica",
			"github.com/chime-nats/chime/api",
		}},
	} {
		out, err := exec.Command("go", "list", "-deps", c.pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", c.pkg, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, f := range c.forbidden {
				if strings.HasPrefix(dep, f) {
					t.Errorf("%s links %s", c.pkg, dep)
				}
			}
		}
	}
}
