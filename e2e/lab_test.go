package e2e_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/chime-nats/chime/internal/natsproc"
	"github.com/chime-nats/chime/internal/netns"
)

// labCluster starts three nats-servers, n1 to n3, each in a network
// namespace of its own (named as the server) on a new lab, and waits until
// JetStream is ready. Both are closed when the test ends, the cluster
// first: a server left in a namespace keeps it alive. more, when set, adds
// to each server's options. It needs root (see needNetns).
func labCluster(ctx context.Context, t *testing.T, more func(i int, o *natsproc.Options)) (*netns.Lab, *natsproc.ClusterT) {
	t.Helper()
	needNetns(ctx, t)
	lab, err := netns.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Error(err)
		}
	})
	members := make([]*netns.Member, 3)
	for i := range members {
		if members[i], err = lab.Add(ctx, fmt.Sprintf("n%d", i+1)); err != nil {
			t.Fatal(err)
		}
	}
	cluster, err := natsproc.ClusterEach(len(members), natsproc.Options{Dir: t.TempDir(), Logf: t.Logf}, func(i int, o *natsproc.Options) {
		o.Host, o.Wrap = members[i].Addr.String(), members[i].Wrap()
		if more != nil {
			more(i, o)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Close() })
	if err := cluster.WaitJetStreamReady(ctx); err != nil {
		t.Fatal(err)
	}
	return lab, cluster
}
