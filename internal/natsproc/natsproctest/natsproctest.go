// Package natsproctest adapts natsproc to tests: every call fails the test
// with t.Fatal instead of returning an error, servers are closed when the
// test ends, and a failed test's log shows each server's log tail.
package natsproctest

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/natsproc"
)

// Server is a natsproc.Server whose Start, Restart, Kill and Stop fail the
// test. Call them from the test goroutine.
type Server struct {
	*natsproc.Server
	tb        testing.TB
	tailShown atomic.Bool // a failure's message carried the log tail
}

// New configures a server without starting it, its files in a temp dir of
// tb's (unless opts.Dir says otherwise); it is killed when the test ends.
func New(tb testing.TB, opts natsproc.Options) *Server {
	tb.Helper()
	if opts.Dir == "" {
		opts.Dir = tb.TempDir()
	}
	opts.Logf = tb.Logf
	s, err := natsproc.New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	return wrap(tb, s)
}

// wrap registers s's Close, and its log tail for a failed test, with tb.
func wrap(tb testing.TB, s *natsproc.Server) *Server {
	w := &Server{Server: s, tb: tb}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Error(err)
		}
		if tb.Failed() && !w.tailShown.Load() {
			tb.Logf("natsproc: server %s log tail (%s):\n%s", s.Name(), s.LogPath(), s.LogTail(natsproc.LogTailLines))
		}
	})
	return w
}

// check fails the test with err, which natsproc gave with the log tail.
func (s *Server) check(err error) {
	s.tb.Helper()
	if err != nil {
		s.tailShown.Store(true)
		s.tb.Fatal(err)
	}
}

// Standalone starts a single JetStream server with a file store in a temp
// dir and waits until it accepts connections.
func Standalone(tb testing.TB) *Server {
	tb.Helper()
	s := New(tb, natsproc.Options{Name: "standalone"})
	s.Start()
	return s
}

// Start starts the process and waits until it answers a NATS ping.
func (s *Server) Start() {
	s.tb.Helper()
	s.check(s.Server.Start())
}

// Restart kills the server if it runs and starts it on the same store.
func (s *Server) Restart() {
	s.tb.Helper()
	s.check(s.Server.Restart())
}

// Kill sends SIGKILL and waits for the process to exit.
func (s *Server) Kill() {
	s.tb.Helper()
	s.check(s.Server.Kill())
}

// Stop sends SIGTERM and waits for a clean exit.
func (s *Server) Stop() {
	s.tb.Helper()
	s.check(s.Server.Stop())
}

// ClusterT is a natsproc.ClusterT whose servers are Servers.
type ClusterT struct {
	*natsproc.ClusterT
	Servers []*Server
	tb      testing.TB
}

// Cluster starts n servers routed to each other, their files in a temp dir
// of tb's, and waits until each accepts connections; they are killed when
// the test ends.
func Cluster(tb testing.TB, n int) *ClusterT {
	tb.Helper()
	c, err := natsproc.Cluster(n, natsproc.Options{Dir: tb.TempDir(), Logf: tb.Logf})
	if err != nil {
		tb.Fatal(err)
	}
	ct := &ClusterT{ClusterT: c, tb: tb}
	for _, s := range c.Servers {
		ct.Servers = append(ct.Servers, wrap(tb, s))
	}
	return ct
}

// WaitJetStreamReady waits until JetStream can place a stream on every
// running server (see natsproc).
func (c *ClusterT) WaitJetStreamReady(ctx context.Context) {
	c.tb.Helper()
	if err := c.ClusterT.WaitJetStreamReady(ctx); err != nil {
		c.tb.Fatal(err)
	}
}

// Server returns the server with the given server_name, nil if none.
func (c *ClusterT) Server(name string) *Server {
	for _, s := range c.Servers {
		if s.Name() == name {
			return s
		}
	}
	return nil
}

// StreamLeader returns the server leading stream right now.
func (c *ClusterT) StreamLeader(ctx context.Context, js jetstream.JetStream, stream string) (*Server, error) {
	return c.of(c.ClusterT.StreamLeader(ctx, js, stream))
}

// KVLeader returns the server leading the bucket's stream right now.
func (c *ClusterT) KVLeader(ctx context.Context, js jetstream.JetStream, bucket string) (*Server, error) {
	return c.of(c.ClusterT.KVLeader(ctx, js, bucket))
}

// WaitStreamLeader waits until stream has a leader other than exclude.
func (c *ClusterT) WaitStreamLeader(ctx context.Context, js jetstream.JetStream, stream string, exclude ...*Server) (*Server, error) {
	ex := make([]*natsproc.Server, len(exclude))
	for i, s := range exclude {
		ex[i] = s.Server
	}
	return c.of(c.ClusterT.WaitStreamLeader(ctx, js, stream, ex...))
}

func (c *ClusterT) of(s *natsproc.Server, err error) (*Server, error) {
	if err != nil || s == nil {
		return nil, err
	}
	return c.Server(s.Name()), nil
}
