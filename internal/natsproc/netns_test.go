package natsproc_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/natsproc"
	"github.com/chime-nats/chime/internal/netns"
)

// TestClusterInNamespaces runs a cluster with each server in its own
// network namespace, on its own address, reached from the host through
// the lab's bridge; the pid Kill signals must be the server's own, not
// a wrapper's, and a wrapped server must come back on Restart.
func TestClusterInNamespaces(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	if err := netns.Available(ctx); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set, and network namespaces are not available: %v", err)
		}
		t.Skipf("network namespaces not available: %v", err)
	}
	lab, err := netns.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := lab.Close(); err != nil {
			t.Error(err)
		}
	}()
	members := make([]*netns.Member, 3)
	for i := range members {
		if members[i], err = lab.Add(ctx, fmt.Sprintf("n%d", i+1)); err != nil {
			t.Fatal(err)
		}
	}
	c, err := natsproc.ClusterEach(3, natsproc.Options{Dir: t.TempDir()}, func(i int, o *natsproc.Options) {
		o.Host, o.Wrap = members[i].Addr.String(), members[i].Wrap()
	})
	if err != nil {
		t.Fatal(err)
	}
	// Closed before the lab: a server left in a namespace keeps it alive.
	defer c.Close()
	for i, s := range c.Servers {
		if want := members[i].Addr.String(); !strings.Contains(s.ClientURL(), want) || !strings.Contains(s.ClusterURL(), want) {
			t.Errorf("%s: URLs %s, %s, not on %s", s.Name(), s.ClientURL(), s.ClusterURL(), want)
		}
	}
	if err := c.WaitJetStreamReady(ctx); err != nil {
		t.Fatal(err)
	}
	s := c.Servers[0]
	pid := s.Pid()
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil || filepath.Base(exe) == "ip" {
		t.Fatalf("pid %d is %q (%v), not the server", pid, exe, err)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
		t.Errorf("pid %d still exists after Restart's kill", pid)
	}
	if err := c.WaitJetStreamReady(ctx); err != nil {
		t.Fatal(err)
	}
	_, js, _ := connect(t, c.URLs())
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "NS", Subjects: []string{"ns.>"}, Replicas: 3}); err != nil {
		t.Fatalf("R3 stream after the restart: %v", err)
	}
}
