package e2e_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/api"
	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/natsproc"
	"github.com/chime-nats/chime/internal/natsproc/natsproctest"
	"github.com/chime-nats/chime/notifications"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
	"github.com/chime-nats/chime/waits"
)

// The security suite: one test per class of attack a principal can try
// through chime itself, with NATS authorization on. The server refuses
// every direct publish outside a principal's lane (TestNATSAuthorization);
// these are the requests that are allowed, aimed so that chime's own
// answer would write elsewhere.

// refusedReplies is the metric of requests refused for their reply subject.
const refusedReplies = `chime_requests_refused_total{reason="reply_subject"}`

// quiet subscribes to subjects and fails the test at cleanup if any
// message arrived there.
func quiet(t *testing.T, nc *nats.Conn, subs ...string) func() {
	t.Helper()
	got := make(chan *nats.Msg, 64)
	for _, s := range subs {
		sub, err := nc.ChanSubscribe(s, got)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		select {
		case m := <-got:
			t.Errorf("%s received %q", m.Subject, m.Data)
		default:
		}
	}
}

// issue has an operator issue an agent token for agentID.
func issue(t *testing.T, ctx context.Context, opConn *nats.Conn, agentID string) string {
	t.Helper()
	c, _ := client.New(opConn, agentID)
	tok, err := c.IssueToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return tok.Token
}

// TestSecurityReplySubjects: an agent's requests to its own subjects,
// and a callback sender's callbacks, with reply subjects aimed at chime's
// state, at other agents' inboxes and request subjects, and at chime's own
// inboxes, are refused unserved: no token minted, no lease taken, nothing
// delivered or stored for another agent, nothing done for the attacker.
func TestSecurityReplySubjects(t *testing.T) {
	url, op, p := authedChime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	opConn := connectAs(t, url, nil, nats.Token(op))
	opBob, _ := client.New(opConn, "bob")
	aliceTok, bobTok := issue(t, ctx, opConn, "alice"), issue(t, ctx, opConn, "bob")
	alice := connectAs(t, url, nil, client.ConnectOptions("alice", aliceTok)...)
	ac, _ := client.New(alice, "alice")
	bob := connectAs(t, url, nil, client.ConnectOptions("bob", bobTok)...)
	bc, _ := client.New(bob, "bob")
	started, err := opBob.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wake, bobWakeToken := wakeTrigger(started)
	if _, err := bc.Notify(ctx, client.Notification{Message: "deploying", ID: "deploy-7"}); err != nil {
		t.Fatal(err)
	}
	bobQuiet := quiet(t, bob, subjects.Inbox("bob"), subjects.Agent("bob", waits.ActionWaitProgress),
		subjects.Agent("bob", notifications.ActionNotifications), access.AgentInboxPrefix("bob")+".abc.>")
	inboxBefore := inboxCount(t, p.httpAddr, op)

	// A token alice would like to make valid for herself.
	minted := access.AgentTokenPrefix + strings.Repeat("m", 43)
	sum := sha256.Sum256([]byte(minted))
	attacks := []struct{ action, body, reply string }{
		{tasks.ActionTaskStart, `{"task_id":"t1"}`, "$KV." + engine.TokensBucket + ".tok." + hex.EncodeToString(sum[:])},
		{tasks.ActionTaskStart, `{"task_id":"t2"}`, "$KV." + engine.LeasesBucket + ".replica.evil"},
		{subjects.ActionTimerList, `{}`, "$KV." + engine.AgentsBucket + ".bob"},
		{notifications.ActionNotify, `{"message":"planted"}`, "$KV." + engine.NotificationsBucket + ".bob.x"},
		{notifications.ActionNotify, `{"message":"overwrite","id":"deploy-7"}`, subjects.Agent("bob", notifications.ActionNotify)},
		{subjects.ActionTimerList, `{}`, subjects.Inbox("bob")},
		{subjects.ActionTimerList, `{}`, subjects.Agent("bob", waits.ActionWaitProgress)},
		{subjects.ActionTimerList, `{}`, subjects.Agent("bob", notifications.ActionNotifications)},
		{subjects.ActionTimerList, `{}`, access.AgentInboxPrefix("bob") + ".abc.1"},
		{subjects.ActionTimerList, `{}`, "_INBOX.callback." + wake.ID + ".abc"},
		{subjects.ActionTimerList, `{}`, access.ServiceInboxPrefix + ".abc.1"},
		{subjects.ActionTimerCreate, `{"duration_ms":1000}`, subjects.TimerFire},
	}
	for _, a := range attacks {
		if err := alice.PublishRequest(subjects.Agent("alice", a.action), a.reply, []byte(a.body)); err != nil {
			t.Fatal(err)
		}
	}
	// A callback sender with bob's wake token, and one with a wrong token.
	cb := connectAs(t, url, nil, nats.Token(bobWakeToken), nats.CustomInboxPrefix("_INBOX.callback."+wake.ID))
	cbAttacks := []struct{ token, reply string }{
		{bobWakeToken, "$KV." + engine.AgentsBucket + ".bob"},
		{bobWakeToken, subjects.Inbox("bob")},
		{bobWakeToken, "_INBOX.callback.other.abc"},
		{"cb_wrong", subjects.Agent("bob", notifications.ActionNotify)},
		{"cb_wrong", "$KV." + engine.TriggersBucket + ".x"},
	}
	for _, a := range cbAttacks {
		m := nats.NewMsg(subjects.CallbackWake)
		m.Reply = a.reply
		m.Header.Set(subjects.HeaderCallbackToken, a.token)
		if err := cb.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	// The server itself refuses a reply into the JetStream API.
	v := &violations{}
	aliceV := connectAs(t, url, v, client.ConnectOptions("alice", aliceTok)...)
	purge := "$JS.API.STREAM.PURGE." + engine.InboxStream
	if err := aliceV.PublishRequest(subjects.Agent("alice", subjects.ActionTimerList), purge, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	v.reported(t, `permissions violation for publish with reply of "`+purge+`"`)
	want := float64(len(attacks) + len(cbAttacks))
	// Every attack has been handled once the count is reached; without the
	// count (chime serving them), a moment for their effects to land.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got, _ := p.metricIf(t, refusedReplies); got >= want {
			break
		}
	}
	if got, _ := p.metricIf(t, refusedReplies); got != want {
		t.Errorf("%s = %v, want %v", refusedReplies, got, want)
	}

	// Nothing was done for alice.
	if tasks, err := ac.ListTasks(ctx, 10); err != nil || len(tasks) != 0 {
		t.Errorf("alice's tasks: %+v %v", tasks, err)
	}
	if h, err := ac.Notifications(ctx, nil); err != nil || h.Count != 0 {
		t.Errorf("alice's notifications: %+v %v", h, err)
	}
	if list, err := ac.ListTimers(ctx, 10); err != nil || len(list) != 0 {
		t.Errorf("alice's timers: %+v %v", list, err)
	}
	// No token was minted.
	refusedAtConnect(t, url, "the token alice tried to mint", client.ConnectOptions("alice", minted)...)
	// Bob got nothing, his notification is his, his callback still works.
	h, err := bc.Notifications(ctx, nil)
	if err != nil || h.Count != 1 || h.Notifications[0].Message != "deploying" {
		t.Errorf("bob's notifications: %+v %v", h, err)
	}
	if after := inboxCount(t, p.httpAddr, op); after != inboxBefore {
		t.Errorf("inbox stream went from %d to %d messages", inboxBefore, after)
	}
	bobQuiet()
	m := nats.NewMsg(subjects.CallbackWake)
	m.Header.Set(subjects.HeaderCallbackToken, bobWakeToken)
	res, err := cb.RequestMsgWithContext(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	var reply callbacks.CallbackReply
	if err := subjects.DecodeReply(res.Data, &reply); err != nil || reply.Result.Disposition != callbacks.DispositionTriggered {
		t.Errorf("bob's wake after the attacks: %+v %v", reply, err)
	}
	// Every shard is still held.
	if held := p.metric(t, "chime_shards_held"); held != 32 {
		t.Errorf("chime_shards_held = %v, want 32", held)
	}
	// Alice's own requests, answered on her own inbox, still work.
	if _, err := ac.CreateTimer(ctx, 60_000, 0, "fine"); err != nil {
		t.Fatal(err)
	}

	// A flood aimed at many inboxes (it filled CHIME_INBOX in 14 s and
	// evicted every agent's deliveries): every request refused, bob's
	// stored delivery kept, and his timer due meanwhile delivered.
	stored := inboxCount(t, p.httpAddr, op)
	bobTimer, err := bc.CreateTimer(ctx, 1000, 0, "during the flood")
	if err != nil {
		t.Fatal(err)
	}
	const flood = 2000
	before, _ := p.metricIf(t, refusedReplies)
	big := `{"message":"` + strings.Repeat("x", 4000) + `"}`
	for i := range flood {
		if err := alice.PublishRequest(subjects.Agent("alice", notifications.ActionNotify), subjects.Inbox(fmt.Sprintf("n%d", i)), []byte(big)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "the flood refused", func() bool { v, _ := p.metricIf(t, refusedReplies); return v >= before+flood })
	var fired *subjects.Envelope
	eventually(t, 10*time.Second, "bob's timer delivered", func() bool {
		got, err := bc.FetchInbox(ctx, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range got.Deliveries {
			var env subjects.Envelope
			if json.Unmarshal(d.Envelope, &env) == nil && env.Source.ID == bobTimer.ID {
				fired = &env
				t.Logf("bob's timer, due during a flood of %d refused requests, stored %v after its due time", flood, d.StoredAt.Sub(*bobTimer.NextFireAt).Round(time.Millisecond))
			}
		}
		return fired != nil
	})
	if after := inboxCount(t, p.httpAddr, op); after != stored+1 {
		t.Errorf("inbox stream holds %d deliveries after the flood, want %d (bob's timer only)", after, stored+1)
	}
}

// TestSecurityExternalServer: the same confinement against a standalone
// nats-server configured with `chime nats-config`'s block: chime answers
// through its responder nkey user, and a reply aimed into chime's state is
// refused unserved.
func TestSecurityExternalServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	keys, err := access.EnsureKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	userSeed := filepath.Join(dir, access.UserKeyFile)
	creds, err := nats.NkeyOptionFromSeed(userSeed)
	if err != nil {
		t.Fatal(err)
	}
	srv := natsproctest.New(t, natsproc.Options{Config: access.ServerConfig(keys, api.Rights()), ConnectOptions: []nats.Option{creds}})
	srv.Start()
	op := "op-external-" + strings.Repeat("y", 16)
	sum := sha256.Sum256([]byte(op))
	opsFile := filepath.Join(dir, "operators")
	if err := os.WriteFile(opsFile, []byte(hex.EncodeToString(sum[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startServe(t, "external", "CHIME_NATS_URL="+srv.ClientURL(), "CHIME_NATS_AUTH=true",
		"CHIME_NATS_NKEY_FILE="+userSeed, "CHIME_NATS_CALLOUT_KEY_FILE="+filepath.Join(dir, access.CalloutKeyFile),
		"CHIME_NATS_RESPONDER_NKEY_FILE="+filepath.Join(dir, access.ResponderKeyFile), "CHIME_OPERATOR_TOKENS_FILE="+opsFile,
		"CHIME_NATS_SYSTEM_NKEY_FILE="+filepath.Join(dir, access.SystemKeyFile))

	opConn := connectAs(t, srv.ClientURL(), nil, nats.Token(op))
	opAlice, _ := client.New(opConn, "alice")
	tok := issue(t, ctx, opConn, "alice")
	alice := connectAs(t, srv.ClientURL(), nil, client.ConnectOptions("alice", tok)...)
	ac, _ := client.New(alice, "alice")
	if _, err := ac.CreateTimer(ctx, 60_000, 0, "answered on her inbox"); err != nil {
		t.Fatal(err)
	}
	minted := access.AgentTokenPrefix + strings.Repeat("n", 43)
	msum := sha256.Sum256([]byte(minted))
	if err := alice.PublishRequest(subjects.Agent("alice", tasks.ActionTaskStart), "$KV."+engine.TokensBucket+".tok."+hex.EncodeToString(msum[:]), []byte(`{"task_id":"t1"}`)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the attack refused", func() bool { v, _ := p.metricIf(t, refusedReplies); return v == 1 })
	refusedAtConnect(t, srv.ClientURL(), "the token alice tried to mint", client.ConnectOptions("alice", minted)...)
	if tasks, err := ac.ListTasks(ctx, 10); err != nil || len(tasks) != 0 {
		t.Errorf("alice's tasks: %+v %v", tasks, err)
	}
	// Revoking her token ends her connection, through the system account.
	_, closed := closes(t, srv.ClientURL(), client.ConnectOptions("alice", tok)...)
	if _, err := opAlice.RevokeTokens(ctx); err != nil {
		t.Fatal(err)
	}
	if d := closed(); d > 2*time.Second {
		t.Errorf("alice's connection closed %v after the revoke, want within 2s", d)
	}
}

// closes connects with opts and returns a func that waits until the
// connection is closed and says how long after it was called.
func closes(t *testing.T, url string, opts ...nats.Option) (*nats.Conn, func() time.Duration) {
	t.Helper()
	closed := make(chan time.Time, 1)
	nc := connectAs(t, url, nil, append(opts, nats.ClosedHandler(func(*nats.Conn) { closed <- time.Now() }))...)
	// Its rights are live: a subscription of its own is accepted.
	if _, err := nc.SubscribeSync(nc.NewRespInbox()); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return nc, func() time.Duration {
		t.Helper()
		start := time.Now()
		select {
		case at := <-closed:
			return at.Sub(start)
		case <-time.After(10 * time.Second):
			t.Fatalf("%s still connected 10 s after its revocation", nc.Opts.Name)
			return 0
		}
	}
}

// TestSecurityRevocationEndsSessions: revoking an agent's tokens, or a
// callback trigger, closes the NATS connections they opened, and their
// reconnects are refused.
func TestSecurityRevocationEndsSessions(t *testing.T) {
	url, op, p := authedChime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opConn := connectAs(t, url, nil, nats.Token(op))
	opAlice, _ := client.New(opConn, "alice")
	tok := issue(t, ctx, opConn, "alice")
	started, err := opAlice.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wake, wakeToken := wakeTrigger(started)
	agentOpts := append(client.ConnectOptions("alice", tok), nats.Name("alice"))
	_, aliceClosed := closes(t, url, agentOpts...)
	_, aliceClosed2 := closes(t, url, agentOpts...)
	_, cbClosed := closes(t, url, nats.Token(wakeToken), nats.CustomInboxPrefix("_INBOX.callback."+wake.ID), nats.Name("callback"))
	// Another agent's connection is not touched.
	bob := connectAs(t, url, nil, client.ConnectOptions("bob", issue(t, ctx, opConn, "bob"))...)

	// Her event stream over HTTP, open before the revoke.
	streamEnded := make(chan time.Time, 1)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.httpAddr+"/api/agents/alice/notifications/events", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("alice's event stream: %v %v", res, err)
	}
	defer res.Body.Close()
	go func() {
		_, _ = io.Copy(io.Discard, res.Body)
		streamEnded <- time.Now()
	}()

	revoked := time.Now()
	if _, err := opAlice.RevokeTokens(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-streamEnded:
		if d := at.Sub(revoked); d > 2*time.Second {
			t.Errorf("alice's event stream ended %v after the revoke, want within 2s", d)
		}
	case <-time.After(10 * time.Second):
		t.Error("alice's event stream still open 10 s after the revoke")
	}
	for _, closed := range []func() time.Duration{aliceClosed, aliceClosed2} {
		if d := closed(); d > 2*time.Second {
			t.Errorf("an agent connection closed %v after the revoke, want within 2s", d)
		} else {
			t.Logf("agent connection closed %v after the revoke returned", d)
		}
	}
	if _, err := opAlice.ResetCallback(ctx, callbacks.ModeWakeHint); err != nil {
		t.Fatal(err)
	}
	if d := cbClosed(); d > 2*time.Second {
		t.Errorf("the callback sender's connection closed %v after the reset, want within 2s", d)
	}
	refusedAtConnect(t, url, "the revoked agent token", client.ConnectOptions("alice", tok)...)
	refusedAtConnect(t, url, "the revoked callback token", nats.Token(wakeToken))
	bc, _ := client.New(bob, "bob")
	if _, err := bc.ListTimers(ctx, 1); err != nil || !bob.IsConnected() {
		t.Errorf("bob after alice's revocation: connected %v, %v", bob.IsConnected(), err)
	}
}

// TestSecurityNoJetStreamForPrincipals: a JetStream request answers, and a
// consumer delivers, to a subject the requester names, with the stream's
// rights. So no principal has any JetStream right: an agent's consumer
// with another agent's subject as its deliver subject, a pull or a stream
// info whose reply is a bucket's subject, are refused by the server, for
// agents and operators alike; agents read their inbox through chime.
func TestSecurityNoJetStreamForPrincipals(t *testing.T) {
	url, op, p := authedChime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opConn := connectAs(t, url, nil, nats.Token(op))
	v := &violations{}
	alice := connectAs(t, url, v, client.ConnectOptions("alice", issue(t, ctx, opConn, "alice"))...)
	ov := &violations{}
	operator := connectAs(t, url, ov, nats.Token(op))
	inboxBefore := inboxCount(t, p.httpAddr, op)

	push, _ := json.Marshal(map[string]any{"stream_name": engine.InboxStream, "config": map[string]any{
		"durable_name": "inbox-alice", "filter_subject": subjects.Inbox("alice"), "deliver_subject": subjects.Agent("bob", waits.ActionWaitProgress),
	}})
	for who, conn := range map[*violations]*nats.Conn{v: alice, ov: operator} {
		for _, req := range []struct{ subject, reply string }{
			{"$JS.API.CONSUMER.CREATE.CHIME_INBOX.inbox-alice." + subjects.Inbox("alice"), "_INBOX.agent.alice.x"},
			{"$JS.API.CONSUMER.MSG.NEXT.CHIME_INBOX.inbox-alice", "$KV." + engine.NotificationsBucket + ".bob.x"},
			{"$JS.API.STREAM.INFO.CHIME_INBOX", "$KV." + engine.TokensBucket + ".tok.x"},
			{"$JS.API.DIRECT.GET.CHIME_INBOX", "$KV." + engine.AgentsBucket + ".bob"},
		} {
			if err := conn.PublishRequest(req.subject, req.reply, push); err != nil {
				t.Fatal(err)
			}
			who.seen(t, "publish", req.subject)
		}
	}
	// alice reads her inbox through chime instead, and everyone's reads
	// go on.
	ac, _ := client.New(alice, "alice")
	if got, err := ac.FetchInbox(ctx, 0, 0); err != nil || len(got.Deliveries) != 0 {
		t.Fatalf("alice's fetch: %+v %v", got, err)
	}
	if after := inboxCount(t, p.httpAddr, op); after != inboxBefore {
		t.Errorf("inbox stream went from %d to %d messages", inboxBefore, after)
	}
}
