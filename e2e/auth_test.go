package e2e_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/interventions"
	"github.com/chime-nats/chime/notifications"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waits"
)

// authedChime runs chime with NATS authorization on its embedded server
// and an operator token; it returns the NATS URL, the operator token and
// the replica.
func authedChime(t *testing.T) (string, string, *proc) {
	t.Helper()
	natsAddr, op, env := authedEnv(t)
	return "nats://" + natsAddr, op, startServe(t, "auth", env...)
}

// authedEnv is the environment of a chime with NATS authorization on its
// embedded server, at natsAddr, and the operator token op; a chime
// restarted with it has the same store.
func authedEnv(t *testing.T) (natsAddr, op string, env []string) {
	t.Helper()
	op = "op-" + strings.Repeat("x", 8) + t.Name()
	sum := sha256.Sum256([]byte(op))
	file := filepath.Join(t.TempDir(), "operators")
	if err := os.WriteFile(file, []byte(hex.EncodeToString(sum[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	natsAddr = freeAddr(t)
	return natsAddr, op, []string{"CHIME_NATS_AUTH=true", "CHIME_NATS_LISTEN=" + natsAddr,
		"CHIME_DATA_DIR=" + t.TempDir(), "CHIME_OPERATOR_TOKENS_FILE=" + file}
}

// violations collects the permission violations the server reports to a
// connection.
type violations struct {
	mu   sync.Mutex
	errs []string
}

func (v *violations) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.errs = append(v.errs, err.Error())
}

// seen waits until a violation naming subject has been reported.
func (v *violations) seen(t *testing.T, op, subject string) {
	t.Helper()
	v.reported(t, "permissions violation for "+op+` to "`+subject+`"`)
}

// reported waits until a violation containing text has been reported.
func (v *violations) reported(t *testing.T, text string) {
	t.Helper()
	want := strings.ToLower(text)
	eventually(t, 5*time.Second, "violation "+want, func() bool {
		v.mu.Lock()
		defer v.mu.Unlock()
		for _, e := range v.errs {
			if strings.Contains(strings.ToLower(e), want) {
				return true
			}
		}
		return false
	})
}

func connectAs(t *testing.T, url string, v *violations, opts ...nats.Option) *nats.Conn {
	t.Helper()
	if v != nil {
		opts = append(opts, nats.ErrorHandler(v.handler))
	}
	nc, err := nats.Connect(url, append(opts, nats.MaxReconnects(0))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func refusedAtConnect(t *testing.T, url, what string, opts ...nats.Option) {
	t.Helper()
	nc, err := nats.Connect(url, append(opts, nats.MaxReconnects(0), nats.Timeout(5*time.Second))...)
	if err == nil {
		nc.Close()
		t.Fatalf("%s: connected", what)
	}
	if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("%s: %v, want an authorization violation", what, err)
	}
}

func TestNATSAuthorization(t *testing.T) {
	url, op, p := authedChime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The operator issues tokens over NATS and over HTTP.
	opConn := connectAs(t, url, nil, nats.Token(op))
	opAlice, _ := client.New(opConn, "alice")
	aliceTok, err := opAlice.IssueToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(aliceTok.Token, access.AgentTokenPrefix) || aliceTok.AgentID != "alice" {
		t.Fatalf("issued %+v", aliceTok.AgentToken)
	}
	bobTok := issueOverHTTP(t, p.httpAddr, op, "bob")

	v := &violations{}
	alice := connectAs(t, url, v, client.ConnectOptions("alice", aliceTok.Token)...)
	ac, _ := client.New(alice, "alice")
	bob := connectAs(t, url, nil, client.ConnectOptions("bob", bobTok)...)
	bc, _ := client.New(bob, "bob")
	bobTimer, err := bc.CreateTimer(ctx, 3_600_000, 0, "bob's")
	if err != nil {
		t.Fatal(err)
	}

	t.Run("agent reads and writes its own", func(t *testing.T) {
		live := make(chan *nats.Msg, 4)
		sub, err := alice.ChanSubscribe(subjects.Inbox("alice"), live)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := alice.Flush(); err != nil {
			t.Fatal(err)
		}
		tm, err := ac.CreateTimer(ctx, 50, 0, "mine")
		if err != nil {
			t.Fatal(err)
		}
		if list, err := ac.ListTimers(ctx, 10); err != nil || len(list) != 1 || list[0].ID != tm.ID {
			t.Fatalf("list: %v %v", list, err)
		}
		// Her notifications: she sends, lists and follows her own.
		changes := make(chan notifications.NotificationChange, 4)
		follow, err := ac.FollowNotifications(func(c notifications.NotificationChange) { changes <- c })
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = follow.Unsubscribe() }()
		if err := alice.Flush(); err != nil {
			t.Fatal(err)
		}
		sent, err := ac.Notify(ctx, client.Notification{Message: "done"})
		if err != nil {
			t.Fatal(err)
		}
		if h, err := ac.Notifications(ctx, nil); err != nil || h.Count != 1 || h.Notifications[0].ID != sent.ID {
			t.Fatalf("her notifications: %+v %v", h, err)
		}
		select {
		case c := <-changes:
			if c.Op != notifications.OpUpsert || c.Notification.ID != sent.ID {
				t.Fatalf("change %+v", c)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no change on agent.alice.notifications")
		}
		select {
		case m := <-live:
			if !strings.Contains(string(m.Data), tm.ID) {
				t.Fatalf("inbox got %s", m.Data)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no fire on the plain subscription")
		}
		// And from the stream, through chime: fetch, ack, and the acked
		// delivery does not come again.
		got, err := ac.FetchInbox(ctx, 10, 5*time.Second)
		if err != nil || len(got.Deliveries) != 1 || !strings.Contains(string(got.Deliveries[0].Envelope), tm.ID) {
			t.Fatalf("fetched %+v: %v", got, err)
		}
		if acked, err := ac.AckInbox(ctx, got.Deliveries[0].Seq); err != nil || acked != got.Deliveries[0].Seq {
			t.Fatalf("ack: %d %v", acked, err)
		}
		if again, err := ac.FetchInbox(ctx, 10, 0); err != nil || len(again.Deliveries) != 0 {
			t.Fatalf("after the ack: %+v %v", again, err)
		}
		// No JetStream right of her own, not even for a consumer of her
		// own inbox: its deliver subject would be hers to choose.
		js, _ := jetstream.New(alice)
		short, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if _, err := js.CreateOrUpdateConsumer(short, engine.InboxStream, jetstream.ConsumerConfig{
			Durable: agents.InboxConsumer("alice"), FilterSubject: subjects.Inbox("alice"),
		}); err == nil {
			t.Fatal("a consumer of her inbox was created")
		}
		v.seen(t, "publish", "$JS.API.CONSUMER.CREATE.CHIME_INBOX.inbox-alice.agent.alice.inbox")
	})

	t.Run("agent refused everything else", func(t *testing.T) {
		inboxBefore := inboxCount(t, p.httpAddr, op)
		for _, subj := range []string{subjects.Inbox("bob"), ">", "agent.*.inbox", "_INBOX.>", "$KV.chime_triggers.>", "timer.fire",
			subjects.Agent("bob", notifications.ActionNotifications)} {
			if _, err := alice.SubscribeSync(subj); err != nil {
				t.Fatal(err)
			}
			v.seen(t, "subscription", subj)
		}
		for _, subj := range []string{
			subjects.Agent("bob", subjects.ActionTimerList), subjects.Agent("bob", subjects.ActionTimerCancel),
			subjects.Agent("alice", waits.ActionIntervention), subjects.Agent("alice", callbacks.ActionLifecycleStart),
			subjects.Agent("alice", callbacks.ActionTriggerCreate), subjects.Agent("alice", agents.ActionTokenIssue),
			subjects.Agent("alice", notifications.ActionNotificationsMark), subjects.Agent("alice", notifications.ActionNotificationsClear),
			subjects.Agent("bob", notifications.ActionNotify), subjects.Agent("bob", notifications.ActionNotificationsList),
			subjects.Agent("alice", notifications.ActionNotifications), "$KV.chime_notifications.alice.x",
			subjects.TimerFire, subjects.WaitFire, "intervention.apply.alice", subjects.CallbackEventWake,
			subjects.CallbackWake, subjects.Inbox("alice"), subjects.Inbox("bob"),
			"$KV.chime_timers.bob." + bobTimer.ID, "$JS.API.STREAM.INFO.KV_chime_timers", "$JS.API.STREAM.LIST",
			"$JS.API.STREAM.MSG.GET.CHIME_INBOX", "$JS.API.DIRECT.GET.CHIME_INBOX", "$JS.API.CONSUMER.CREATE.CHIME_INBOX.inbox-bob.agent.bob.inbox",
			"$JS.API.CONSUMER.MSG.NEXT.CHIME_INBOX.inbox-bob",
			// Finished records: neither read nor planted in bob's history.
			"$JS.API.DIRECT.GET.CHIME_HISTORY", "history.timer.bob.0", "history.wait.bob.f",
		} {
			if err := alice.Publish(subj, []byte(`{"action":"message","text":"forged"}`)); err != nil {
				t.Fatal(err)
			}
			v.seen(t, "publish", subj)
		}
		if got, err := bc.GetTimer(ctx, bobTimer.ID); err != nil || got.Status != timers.TimerActive {
			t.Fatalf("bob's timer after the attempts: %+v %v", got, err)
		}
		if after := inboxCount(t, p.httpAddr, op); after != inboxBefore {
			t.Fatalf("inbox stream went from %d to %d messages", inboxBefore, after)
		}
	})

	t.Run("operator and callback sender", func(t *testing.T) {
		start, err := opAlice.Start(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := opAlice.Intervene(ctx, interventions.ActionMessage, "from the operator"); err != nil {
			t.Fatal(err)
		}
		trig, token := wakeTrigger(start)
		cv := &violations{}
		cb := connectAs(t, url, cv, nats.Token(token), nats.CustomInboxPrefix("_INBOX.callback."+trig.ID))
		m := nats.NewMsg(subjects.CallbackWake)
		m.Header.Set(subjects.HeaderCallbackToken, token)
		res, err := cb.RequestMsgWithContext(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		var reply callbacks.CallbackReply
		if err := subjects.DecodeReply(res.Data, &reply); err != nil {
			t.Fatal(err)
		}
		if err := cb.Publish(subjects.Agent("alice", subjects.ActionTimerCreate), []byte(`{"duration_ms":1000}`)); err != nil {
			t.Fatal(err)
		}
		cv.seen(t, "publish", subjects.Agent("alice", subjects.ActionTimerCreate))
	})

	t.Run("same tokens on HTTP", func(t *testing.T) {
		for _, c := range []struct {
			method, path, token string
			want                int
		}{
			{http.MethodGet, "/api/agents/bob/timers", bobTok, http.StatusOK},
			{http.MethodGet, "/api/agents/bob/timers/" + bobTimer.ID, bobTok, http.StatusOK},
			{http.MethodGet, "/api/agents/alice/timers", bobTok, http.StatusForbidden},
			{http.MethodGet, "/api/agents/bobby/timers", bobTok, http.StatusForbidden},
			// The rights of NATS: bob creates his own timers, no one else's.
			{http.MethodPost, "/api/control/agents/bob/timers", bobTok, http.StatusCreated},
			{http.MethodPost, "/api/control/agents/alice/timers", bobTok, http.StatusForbidden},
			{http.MethodPost, "/api/control/agents/bobby/timers", bobTok, http.StatusForbidden},
			{http.MethodPost, "/api/control/agents/bob/token", bobTok, http.StatusForbidden},
			{http.MethodGet, "/api/agents/bob/timers", "", http.StatusUnauthorized},
			{http.MethodGet, "/api/agents/bob/timers", "chime_at_forged", http.StatusUnauthorized},
			{http.MethodGet, "/api/agents/alice/timers", op, http.StatusOK},
		} {
			req, _ := http.NewRequest(c.method, "http://"+p.httpAddr+c.path, strings.NewReader(`{"duration_ms":1000}`))
			if c.token != "" {
				req.Header.Set("Authorization", "Bearer "+c.token)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != c.want {
				t.Errorf("%s %s: %d, want %d", c.method, c.path, res.StatusCode, c.want)
			}
		}
	})

	t.Run("refused at connect", func(t *testing.T) {
		refusedAtConnect(t, url, "no token")
		refusedAtConnect(t, url, "a wrong token", nats.Token("chime_at_nottherightone"))
		refusedAtConnect(t, url, "a wrong operator token", nats.Token(op+"x"))
		rev, err := opAlice.RevokeTokens(ctx)
		if err != nil || rev.Revoked != 1 {
			t.Fatalf("revoke: %+v %v", rev, err)
		}
		refusedAtConnect(t, url, "a revoked agent token", client.ConnectOptions("alice", aliceTok.Token)...)
		// bob's token still works.
		connectAs(t, url, nil, client.ConnectOptions("bob", bobTok)...)
	})
}

// wakeTrigger is the default wake trigger a start handed out, and its token.
func wakeTrigger(start *callbacks.LifecycleReply) (callbacks.TriggerView, string) {
	var trig callbacks.TriggerView
	for _, tv := range start.Triggers {
		if tv.Mode == callbacks.ModeWakeHint {
			trig = tv
		}
	}
	return trig, trig.TriggerURL[strings.LastIndex(trig.TriggerURL, "/")+1:]
}

func issueOverHTTP(t *testing.T, httpAddr, op, agentID string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+httpAddr+"/api/control/agents/"+agentID+"/token", bytes.NewReader(nil))
	req.Header.Set("Authorization", "Bearer "+op)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var tok access.IssuedToken
	if err := json.NewDecoder(res.Body).Decode(&tok); err != nil || res.StatusCode != http.StatusCreated || tok.Token == "" {
		t.Fatalf("issue over HTTP: %d %v", res.StatusCode, err)
	}
	return tok.Token
}

// inboxCount is how many deliveries the inbox stream holds, summed over
// the agents an operator lists.
func inboxCount(t *testing.T, httpAddr, op string) uint64 {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+httpAddr+"/api/agents", nil)
	req.Header.Set("Authorization", "Bearer "+op)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var list agents.ListAgentsReply
	if err := json.NewDecoder(res.Body).Decode(&list); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET /api/agents: %d %v", res.StatusCode, err)
	}
	var n uint64
	for _, a := range list.Agents {
		n += a.Deliveries
	}
	return n
}

// TestCLIWithTokens: an operator issues a token with the CLI, the agent
// uses it with --token; a command its token does not allow is refused at
// once, naming the violation.
func TestCLIWithTokens(t *testing.T) {
	url, op, _ := authedChime(t)
	addr := strings.TrimPrefix(url, "nats://")
	out, errOut, code := chimeCLI(t, addr, "agent", "token", "--agent", "carol", "--token", op)
	if code != 0 {
		t.Fatalf("agent token: exit %d: %s", code, errOut)
	}
	var tok access.IssuedToken
	if err := json.Unmarshal([]byte(out), &tok); err != nil || tok.AgentID != "carol" || !strings.HasPrefix(tok.Token, access.AgentTokenPrefix) {
		t.Fatalf("agent token printed %q: %v", out, err)
	}
	tm := cliTimer(t, addr, "timer", "create", "--after-ms", "60000", "--agent", "carol", "--token", tok.Token)
	if tm.AgentID != "carol" {
		t.Fatalf("created %+v", tm)
	}
	start := time.Now()
	_, errOut, code = chimeCLI(t, addr, "timer", "list", "--agent", "dave", "--token", tok.Token)
	// Refused at its first step: the reply subscription under dave's prefix.
	if code == 0 || !strings.Contains(errOut, "refused: nats: permissions violation") || !strings.Contains(errOut, "agent.dave.") {
		t.Fatalf("list of dave's timers with carol's token: exit %d: %s", code, errOut)
	}
	t.Logf("refused after %v", time.Since(start).Round(time.Millisecond))
	if _, errOut, code = chimeCLI(t, addr, "timer", "list", "--agent", "carol"); code == 0 || !strings.Contains(strings.ToLower(errOut), "authorization violation") {
		t.Fatalf("no token: exit %d: %s", code, errOut)
	}
}
