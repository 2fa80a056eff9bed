package access_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/api"
	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/natsproc"
	"github.com/chime-nats/chime/internal/natsproc/natsproctest"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/subjects"
)

func TestAgentTokens(t *testing.T) {
	ns := natstest.Server(t)
	nc, res := natstest.Provisioned(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tokens := access.NewTokens(res.Tokens, nc, engine.DefaultMarkerTTL, nil)

	a1, err := tokens.Issue(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := tokens.Issue(ctx, "alice")
	b, _ := tokens.Issue(ctx, "bob")
	if a1.Token == a2.Token || !strings.HasPrefix(a1.Token, access.AgentTokenPrefix) {
		t.Fatalf("tokens %q %q", a1.Token, a2.Token)
	}
	for _, tok := range []*access.IssuedToken{a1, a2, b} {
		got, err := tokens.Lookup(ctx, tok.Token)
		if err != nil || got.AgentID != tok.AgentID || got.TokenID != tok.TokenID {
			t.Fatalf("lookup %s: %+v %v", tok.AgentID, got, err)
		}
	}
	// Only hashes are stored: no key or value holds a token.
	keys, _ := res.Tokens.ListKeys(ctx)
	for k := range keys.Keys() {
		e, err := res.Tokens.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		for _, tok := range []string{a1.Token, a2.Token, b.Token} {
			if strings.Contains(k, tok) || strings.Contains(string(e.Value()), tok) {
				t.Fatalf("token stored in the clear at %s", k)
			}
		}
	}
	for _, bad := range []string{"", "chime_at_", a1.Token + "x", "chime_cb_" + a1.Token[9:], strings.Repeat("chime_at_", 40)} {
		if _, err := tokens.Lookup(ctx, bad); !errors.Is(err, access.ErrUnknownToken) {
			t.Errorf("lookup %q: %v", bad, err)
		}
	}
	rev, err := tokens.Revoke(ctx, "alice")
	if err != nil || rev.Revoked != 2 {
		t.Fatalf("revoke: %+v %v", rev, err)
	}
	for _, tok := range []*access.IssuedToken{a1, a2} {
		if _, err := tokens.Lookup(ctx, tok.Token); !errors.Is(err, access.ErrUnknownToken) {
			t.Errorf("revoked token still resolves: %v", err)
		}
	}
	if _, err := tokens.Lookup(ctx, b.Token); err != nil {
		t.Errorf("bob's token after alice's revoke: %v", err)
	}
	if rev, err := tokens.Revoke(ctx, "alice"); err != nil || rev.Revoked != 0 {
		t.Errorf("second revoke: %+v %v", rev, err)
	}
	if _, err := tokens.Issue(ctx, "bad.agent"); err == nil {
		t.Error("issued for an invalid agent ID")
	}
}

// calloutServer runs a real nats-server with the authorization block of
// `chime nats-config`, and chime's callout on a service connection.
func calloutServer(t testing.TB) (url string, tokens *access.Tokens, op string) {
	dir := t.TempDir()
	keys, err := access.EnsureKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(dir, access.UserKeyFile)
	creds, err := nats.NkeyOptionFromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	srv := natsproctest.New(t, natsproc.Options{Config: access.ServerConfig(keys, api.Rights()), ConnectOptions: []nats.Option{creds}})
	srv.Start()
	nc, err := engine.Connect(engine.ConnectOptions{URL: srv.ClientURL(), NkeyFile: seed, Name: "chime test"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := engine.Provision(ctx, js, engine.Topology{Replicas: 1, LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour, DedupWindow: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	issuer, err := access.LoadIssuer(filepath.Join(dir, access.CalloutKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	tokens = access.NewTokens(res.Tokens, nc, engine.DefaultMarkerTTL, nil)
	op = "operator-secret"
	opsFile := filepath.Join(dir, "operators")
	writeHashes(t, opsFile, op)
	operators, err := access.LoadOperatorTokens(opsFile)
	if err != nil {
		t.Fatal(err)
	}
	c := access.NewCallout(access.CalloutConfig{
		NC: nc, Issuer: issuer, Resolver: access.Resolver{Operators: operators, Tokens: tokens}, Registerer: prometheus.NewRegistry(), Rights: api.Rights(),
	})
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	return srv.ClientURL(), tokens, op
}

// TestCalloutOnAnExternalServer is the external-cluster path: the server
// configured from ServerConfig admits each token as its principal only.
func TestCalloutOnAnExternalServer(t *testing.T) {
	url, tokens, op := calloutServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	alice, err := tokens.Issue(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	violation := make(chan error, 8)
	nc, err := nats.Connect(url, append(client.ConnectOptions("alice", alice.Token), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violation <- err }))...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// Her own subjects pass (nobody serves them here: no responders is
	// the server's answer, not a violation).
	if _, err := nc.Request(subjects.Agent("alice", subjects.ActionTimerList), nil, time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("own request: %v", err)
	}
	if err := nc.Publish(subjects.TimerFire, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-violation:
		if !strings.Contains(strings.ToLower(err.Error()), `permissions violation for publish to "timer.fire"`) {
			t.Fatalf("violation: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("timer.fire published without a violation")
	}
	opc, err := nats.Connect(url, nats.Token(op))
	if err != nil {
		t.Fatalf("operator: %v", err)
	}
	opc.Close()
	for _, bad := range []nats.Option{nats.Token("wrong"), nats.UserInfo("chime", "x")} {
		if nc, err := nats.Connect(url, bad, nats.NoReconnect()); err == nil {
			nc.Close()
			t.Fatal("connected with a bad credential")
		}
	}
	if nc, err := nats.Connect(url, nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("connected without a token")
	}
}

// BenchmarkAgentConnect measures agents connecting with tokens through the
// callout: one connect (and close) per op.
func BenchmarkAgentConnect(b *testing.B) {
	url, tokens, _ := calloutServer(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tok, err := tokens.Issue(ctx, "bench")
	if err != nil {
		b.Fatal(err)
	}
	opts := client.ConnectOptions("bench", tok.Token)
	var failed atomic.Int64
	b.SetParallelism(8) // agents connect side by side
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			nc, err := nats.Connect(url, opts...)
			if err != nil {
				failed.Add(1)
				continue
			}
			nc.Close()
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "connects/s")
	if failed.Load() > 0 {
		b.Fatalf("%d connects failed", failed.Load())
	}
}

func TestReplyAllowed(t *testing.T) {
	for _, c := range []struct {
		agent, reply string
		want         bool
	}{
		{"alice", "_INBOX.agent.alice.abc.1", true},
		{"alice", "_INBOX.agent.alice.x", true},
		{"alice", "_INBOX.agent.alicex.abc", false},
		{"alice", "_INBOX.agent.bob.abc", false},
		{"alice", "_INBOX.agent.alice", false},
		{"alice", "_INBOX.callback.t1.abc", false},
		{"alice", "_INBOX.Xyz.1", true}, // an operator's
		{"alice", "$KV.chime_tokens.tok.abc", false},
		{"alice", "$JS.API.STREAM.DELETE.CHIME_INBOX", false},
		{"alice", "agent.bob.inbox", false},
		{"alice", "agent.alice.inbox", false},
		{"alice", "_CHIME_INBOX.abc.1", false},
		{"alice", "_INBOX.*", false},
		{"alice", "_INBOX.x.>", false},
		{"alice", "_INBOX..x", false},
		{"alice", "_INBOX.", false},
		{"alice", "", false},
		{"alice", "_INBOX.op1.abc", true},
	} {
		if got := access.AgentReplyAllowed(c.agent, c.reply); got != c.want {
			t.Errorf("AgentReplyAllowed(%q, %q) = %v, want %v", c.agent, c.reply, got, c.want)
		}
	}
	for _, c := range []struct {
		trigger, reply string
		want           bool
	}{
		{"trg_1", "_INBOX.callback.trg_1.abc", true},
		{"trg_1", "_INBOX.callback.trg_2.abc", false},
		{"trg_1", "_INBOX.op.abc", true},
		{"trg_1", "_INBOX.agent.alice.abc", false},
		{"trg_1", "$KV.chime_agents.bob", false},
		{"", "_INBOX.callback.trg_2.abc", true}, // unknown token: some callback holder
		{"", "_INBOX.callback.abc", false},
		{"", "_INBOX.agent.bob.x", false},
		{"", "agent.bob.notify", false},
	} {
		if got := access.CallbackReplyAllowed(c.trigger, c.reply); got != c.want {
			t.Errorf("CallbackReplyAllowed(%q, %q) = %v, want %v", c.trigger, c.reply, got, c.want)
		}
	}
}

// TestSessionsBoundedPerPrincipal: a principal reconnecting in a loop keeps
// at most 64 session records per server, its newest, so it cannot fill the
// sessions bucket for everyone; ending its sessions clears them, and no
// one else's.
func TestSessionsBoundedPerPrincipal(t *testing.T) {
	ns := natstest.Server(t)
	_, res := natstest.Provisioned(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := access.NewSessions(access.SessionsConfig{KV: res.Sessions, Kick: access.ServerKicker{Server: ns}, MaxAge: time.Hour})
	defer s.Stop(context.Background())
	alice := access.Principal{Kind: access.KindAgent, AgentID: "alice"}
	for cid := range uint64(100) {
		if err := s.Record(ctx, alice, ns.ID(), 1000+cid); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Record(ctx, access.Principal{Kind: access.KindAgent, AgentID: "bob"}, ns.ID(), 7); err != nil {
		t.Fatal(err)
	}
	recorded := func(agentID string) []uint64 {
		t.Helper()
		keys, err := res.Sessions.ListKeysFiltered(ctx, "agent."+agentID+".>")
		if err != nil {
			t.Fatal(err)
		}
		var cids []uint64
		for key := range keys.Keys() {
			e, err := res.Sessions.Get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			cid, _ := strconv.ParseUint(string(e.Value()), 10, 64)
			cids = append(cids, cid)
		}
		slices.Sort(cids)
		return cids
	}
	if got := recorded("alice"); len(got) != 64 || got[0] != 1036 || got[63] != 1099 {
		t.Fatalf("alice's records: %d client IDs, %v", len(got), got)
	}
	if n := s.End(ctx, alice); n != 0 {
		t.Fatalf("ended %d connections that never existed", n)
	}
	if got := recorded("alice"); len(got) != 0 {
		t.Fatalf("alice's records after her sessions ended: %v", got)
	}
	if got := recorded("bob"); len(got) != 1 || got[0] != 7 {
		t.Fatalf("bob's records: %v", got)
	}
}

// TestCalloutNeedsRights: a callout configured without the rights it
// grants would admit every token with every right (a user with no
// publish allowances may publish anywhere); it refuses to start.
func TestCalloutNeedsRights(t *testing.T) {
	for _, r := range []access.Rights{{}, {Agent: []string{"timer.list"}}, {All: []string{"timer.list"}}} {
		if err := access.NewCallout(access.CalloutConfig{Rights: r}).Start(context.Background()); !errors.Is(err, access.ErrNoRights) {
			t.Errorf("rights %+v: %v, want ErrNoRights", r, err)
		}
	}
}
