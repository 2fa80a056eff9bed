// Package natstest starts the real embedded JetStream server tests run against.
package natstest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/engine"
)

// Server starts an embedded JetStream server on 127.0.0.1 with a random port
// and a temporary store, shut down when the test ends.
func Server(t testing.TB) *server.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns, err := engine.StartEmbedded(ctx, engine.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: t.TempDir()}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

// JetStream connects to ns, closed when the test ends, and returns its
// JetStream, with nothing provisioned.
func JetStream(t testing.TB, ns *server.Server) jetstream.JetStream {
	t.Helper()
	return connect(t, ns.ClientURL())
}

// connect opens a connection to url with opts, closed when the test ends,
// and returns its JetStream.
func connect(t testing.TB, url string, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// Provisioned connects to ns and provisions chime's streams and buckets.
func Provisioned(t testing.TB, ns *server.Server) (*nats.Conn, *engine.Resources) {
	t.Helper()
	return ProvisionedAs(t, ns, engine.Topology{
		Replicas: 1, LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour, DedupWindow: 2 * time.Minute,
	})
}

// ProvisionedAs is Provisioned with the topology topo.
func ProvisionedAs(t testing.TB, ns *server.Server, topo engine.Topology) (*nats.Conn, *engine.Resources) {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(16384))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := engine.Provision(ctx, js, topo)
	if err != nil {
		t.Fatal(err)
	}
	return nc, res
}

// SmallServer is Server with a JetStream store of maxStore bytes: tests
// fill it to see what chime does with no room left.
func SmallServer(t testing.TB, maxStore int64) *server.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns, err := engine.StartEmbedded(ctx, engine.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: t.TempDir(), MaxStore: maxStore}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}
