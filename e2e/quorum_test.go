package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/engine"
)

// TestQuorumWatchMovesOffTheMinority: three nats-servers, each in a
// network namespace of its own; a client on the host connected to n1.
// n1 is then cut from its two peers but not from the client, so the
// connection stays up (pings are answered) while JetStream cannot be
// reached through it. The quorum watch moves the connection to a server
// of the majority, where JetStream answers.
func TestQuorumWatchMovesOffTheMinority(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lab, cluster := labCluster(ctx, t, nil)

	nc, err := nats.Connect(cluster.URLs(), nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if got := nc.ConnectedServerName(); got != "n1" {
		t.Fatalf("connected to %s, want n1 (the first URL)", got)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AccountInfo(ctx); err != nil {
		t.Fatalf("JetStream before the cut: %v", err)
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go engine.NewQuorumWatch(engine.QuorumConfig{NC: nc, JS: js, Every: 500 * time.Millisecond, After: 4}).Run(wctx)

	for _, peer := range []string{"n2", "n3"} {
		if err := lab.Separate(ctx, "n1", peer); err != nil {
			t.Fatal(err)
		}
	}
	cut := time.Now()
	for nc.ConnectedServerName() == "n1" || !nc.IsConnected() {
		if ctx.Err() != nil {
			t.Fatalf("still on n1 %v after it was cut from its peers", time.Since(cut).Round(time.Millisecond))
		}
		time.Sleep(100 * time.Millisecond)
	}
	moved := time.Since(cut)
	var err2 error
	for {
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		_, err2 = js.AccountInfo(actx)
		acancel()
		if err2 == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err2 != nil {
		t.Fatalf("JetStream on %s after the move: %v", nc.ConnectedServerName(), err2)
	}
	t.Logf("moved from n1 to %s %v after the cut; JetStream answers there %v after it",
		nc.ConnectedServerName(), moved.Round(time.Millisecond), time.Since(cut).Round(time.Millisecond))
}
