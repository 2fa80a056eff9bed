package natsproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ClusterT is a JetStream cluster of nats-server processes (on 127.0.0.1
// unless ClusterEach gives them hosts), named "chime", whose servers are
// n1, n2, ... in Servers.
type ClusterT struct {
	Servers []*Server
}

// pollInterval paces every retry loop: short against a 4-9 s Raft election
// timeout, long enough not to flood a server that is starting.
const pollInterval = 100 * time.Millisecond

// Cluster starts n servers routed to each other and waits until each accepts
// connections. JetStream may not have a meta leader yet: call
// WaitJetStreamReady before creating streams. Each server takes base's Bin,
// Logf, Config and ConnectOptions; with base.Dir set, server nK keeps its
// files in Dir/nK. On error every server started is closed.
func Cluster(n int, base Options) (c *ClusterT, err error) {
	return ClusterEach(n, base, nil)
}

// ClusterEach is Cluster with each server's options passed to each (i from
// 0) before the server is made, to give it a Host and a Wrap of its own,
// e.g. a network namespace per server. Ports stay those Cluster picks.
func ClusterEach(n int, base Options, each func(i int, o *Options)) (c *ClusterT, err error) {
	if n < 1 {
		return nil, fmt.Errorf("natsproc: cluster of %d servers", n)
	}
	ports, err := FreePorts(2 * n)
	if err != nil {
		return nil, err
	}
	opts := make([]Options, n)
	routes := make([]string, n)
	for i := range n {
		opts[i] = Options{
			Name:           fmt.Sprintf("n%d", i+1),
			Host:           "127.0.0.1",
			ClientPort:     ports[2*i],
			ClusterPort:    ports[2*i+1],
			ClusterName:    "chime",
			Bin:            base.Bin,
			Logf:           base.Logf,
			Config:         base.Config,
			ConnectOptions: base.ConnectOptions,
		}
		if base.Dir != "" {
			opts[i].Dir = filepath.Join(base.Dir, opts[i].Name)
		}
		if each != nil {
			each(i, &opts[i])
		}
		routes[i] = "nats://" + net.JoinHostPort(opts[i].Host, strconv.Itoa(opts[i].ClusterPort))
	}
	c = &ClusterT{}
	started := c // c is nil by the time a failure's return runs this
	defer func() {
		if err != nil {
			err = errors.Join(err, started.Close())
		}
	}()
	for i := range n {
		others := make([]string, 0, n-1)
		others = append(others, routes[:i]...)
		others = append(others, routes[i+1:]...)
		o := opts[i]
		o.Routes = others
		s, err := New(o)
		if err != nil {
			return nil, err
		}
		c.Servers = append(c.Servers, s)
	}
	// Spawn all before waiting on any, so the routes form while each starts.
	for _, s := range c.Servers {
		if err := s.spawn(); err != nil {
			return nil, err
		}
	}
	for _, s := range c.Servers {
		if err := s.waitReady(); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Close closes every server.
func (c *ClusterT) Close() error {
	var errs []error
	for _, s := range c.Servers {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// URLs is the comma-joined client URLs, for nats.Connect.
func (c *ClusterT) URLs() string {
	urls := make([]string, len(c.Servers))
	for i, s := range c.Servers {
		urls[i] = s.ClientURL()
	}
	return strings.Join(urls, ",")
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

// WaitJetStreamReady waits, at most 20 s, until every running server
// answers a JetStream account info request (there is a meta leader it can
// reach) and, when all servers run, until a stream with one replica per
// server can be placed. The meta leader places streams only on peers it has
// heard statistics from, which lags its election: an R3 create right after
// the election can fail with "no suitable peers for placement", and no
// client API shows that state, so a probe stream is created and deleted.
func (c *ClusterT) WaitJetStreamReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	running := 0
	for _, s := range c.Servers {
		if !s.Running() {
			continue
		}
		running++
		if err := retry(ctx, func(ctx context.Context) error { return withJetStream(ctx, s.ClientURL(), accountInfo) }); err != nil {
			return s.fail(fmt.Errorf("JetStream not ready: %w", err))
		}
	}
	if running < len(c.Servers) || running < 2 {
		return nil
	}
	placed := func(ctx context.Context, js jetstream.JetStream) error { return placeProbe(ctx, js, running) }
	if err := retry(ctx, func(ctx context.Context) error { return withJetStream(ctx, c.URLs(), placed) }); err != nil {
		return fmt.Errorf("natsproc: cluster %s: cannot place an R%d stream: %w", c.URLs(), running, err)
	}
	return nil
}

const probeStream = "natsproc_ready"

func accountInfo(ctx context.Context, js jetstream.JetStream) error {
	if _, err := js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("account info: %w", err)
	}
	return nil
}

func placeProbe(ctx context.Context, js jetstream.JetStream, replicas int) error {
	// Creating an identical stream again succeeds, so an attempt whose
	// reply was lost is harmless.
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     probeStream,
		Subjects: []string{"_natsproc.ready"},
		Storage:  jetstream.MemoryStorage,
		Replicas: replicas,
		MaxMsgs:  1,
	})
	if err != nil {
		return fmt.Errorf("create R%d probe stream: %w", replicas, err)
	}
	if err := js.DeleteStream(ctx, probeStream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("delete probe stream: %w", err)
	}
	return nil
}

// withJetStream runs f on a fresh connection to url with a 2 s budget.
func withJetStream(ctx context.Context, url string, f func(context.Context, jetstream.JetStream) error) error {
	nc, err := nats.Connect(url, nats.Timeout(time.Second), nats.NoReconnect(), nats.Name("natsproc-ready"))
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return f(ctx, js)
}

// retry calls f every pollInterval until it succeeds or ctx ends.
func retry(ctx context.Context, f func(context.Context) error) error {
	for {
		last := f(ctx)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), last)
		case <-time.After(pollInterval):
		}
	}
}

// StreamLeader returns the server the stream's info names as its Raft
// leader now, or an error wrapping ErrNoLeader during an election.
func (c *ClusterT) StreamLeader(ctx context.Context, js jetstream.JetStream, stream string) (*Server, error) {
	info, err := streamInfo(ctx, js, stream)
	if err != nil {
		return nil, err
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return nil, fmt.Errorf("stream %s: %w", stream, ErrNoLeader)
	}
	s := c.Server(info.Cluster.Leader)
	if s == nil {
		return nil, fmt.Errorf("stream %s: leader %q is not in this cluster", stream, info.Cluster.Leader)
	}
	return s, nil
}

// KVLeader returns the leader of the stream behind a KV bucket.
func (c *ClusterT) KVLeader(ctx context.Context, js jetstream.JetStream, bucket string) (*Server, error) {
	return c.StreamLeader(ctx, js, "KV_"+bucket)
}

// WaitStreamLeader polls, at most 20 s, until the stream has a leader that
// is none of exclude (typically the server just killed), and returns it.
func (c *ClusterT) WaitStreamLeader(ctx context.Context, js jetstream.JetStream, stream string, exclude ...*Server) (*Server, error) {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	var leader *Server
	err := retry(ctx, func(ctx context.Context) error {
		s, err := c.StreamLeader(ctx, js, stream)
		if err != nil {
			return err
		}
		if slices.Contains(exclude, s) {
			return fmt.Errorf("leader is still %s", s.Name())
		}
		leader = s
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("stream %s: no new leader: %w", stream, err)
	}
	return leader, nil
}

// WaitStreamCurrent polls, at most 20 s, until the stream has a leader and
// as many current, online followers as its replica count asks for: a
// restarted server has caught up.
func (c *ClusterT) WaitStreamCurrent(ctx context.Context, js jetstream.JetStream, stream string) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := retry(ctx, func(ctx context.Context) error { return streamCurrent(ctx, js, stream) }); err != nil {
		return fmt.Errorf("stream %s: replicas not current: %w", stream, err)
	}
	return nil
}

func streamCurrent(ctx context.Context, js jetstream.JetStream, stream string) error {
	info, err := streamInfo(ctx, js, stream)
	if err != nil {
		return err
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return ErrNoLeader
	}
	current := 1 // the leader
	var lagging []string
	for _, p := range info.Cluster.Replicas {
		if p.Current && !p.Offline {
			current++
		} else {
			lagging = append(lagging, fmt.Sprintf("%s(current=%t offline=%t lag=%d)", p.Name, p.Current, p.Offline, p.Lag))
		}
	}
	if want := max(info.Config.Replicas, 1); current < want {
		return fmt.Errorf("%d of %d replicas current, behind: %s", current, want, strings.Join(lagging, " "))
	}
	return nil
}

// streamInfo asks with a short timeout of its own: while a stream is
// leaderless its info request goes unanswered, and the caller's deadline is
// for the whole wait.
func streamInfo(ctx context.Context, js jetstream.JetStream, stream string) (*jetstream.StreamInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s info: %w", stream, err)
	}
	return st.CachedInfo(), nil
}
