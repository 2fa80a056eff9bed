package engine_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"go.uber.org/goleak"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/api"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/storefull"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/subjects"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var topo = engine.Topology{Replicas: 1, LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour, DedupWindow: time.Minute}

func connect(t *testing.T) jetstream.JetStream {
	t.Helper()
	ns := natstest.Server(t)
	nc, err := nats.Connect(ns.ClientURL())
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

// TestProvisionMovesLeasesToFile: a memory-stored leases bucket of an older
// version is made anew, file-stored, so leases survive a server restart.
func TestProvisionMovesLeasesToFile(t *testing.T) {
	js := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: engine.LeasesBucket, TTL: time.Second, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.Provision(ctx, js, topo); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "KV_"+engine.LeasesBucket)
	if err != nil || s.CachedInfo().Config.Storage != jetstream.FileStorage {
		t.Fatalf("leases bucket after provisioning: %v %+v", err, s)
	}
}

// TestHealRecreatesWhatIsMissing: Heal leaves present resources alone and
// re-creates deleted ones.
func TestHealRecreatesWhatIsMissing(t *testing.T) {
	js := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := engine.Provision(ctx, js, topo); err != nil {
		t.Fatal(err)
	}
	if healed, err := engine.Heal(ctx, js, topo); err != nil || len(healed) != 0 {
		t.Fatalf("nothing missing, healed %v (%v)", healed, err)
	}
	if err := js.DeleteStream(ctx, engine.InboxStream); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(ctx, engine.TimersBucket); err != nil {
		t.Fatal(err)
	}
	healed, err := engine.Heal(ctx, js, topo)
	slices.Sort(healed)
	if err != nil || !slices.Equal(healed, []string{engine.InboxStream, engine.TimersBucket}) {
		t.Fatalf("healed %v (%v)", healed, err)
	}
	if _, err := js.KeyValue(ctx, engine.TimersBucket); err != nil {
		t.Fatal(err)
	}
}

// TestProvisionUpdatesStreamLimits: streams made by a version without
// limits get them in place at the next start, and a full inbox drops an
// agent's oldest deliveries, never refuses a new one or touches another
// agent's.
func TestProvisionUpdatesStreamLimits(t *testing.T) {
	js := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := engine.Provision(ctx, js, topo); err != nil { // as before: no limits
		t.Fatal(err)
	}
	for _, name := range []string{engine.InboxStream, engine.EventsStream} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if c := s.CachedInfo().Config; c.MaxBytes != -1 || c.MaxMsgsPerSubject != -1 {
			t.Fatalf("%s without limits: max bytes %d, per subject %d", name, c.MaxBytes, c.MaxMsgsPerSubject)
		}
	}
	for i := range 5 {
		if _, err := js.Publish(ctx, subjects.Inbox("a"), []byte{byte('0' + i)}); err != nil {
			t.Fatal(err)
		}
	}
	limited := topo
	limited.InboxMaxBytes, limited.EventMaxBytes, limited.InboxMaxPerAgent = 64<<20, 32<<20, 3
	if _, err := engine.Provision(ctx, js, limited); err != nil {
		t.Fatal(err)
	}
	inbox, err := js.Stream(ctx, engine.InboxStream)
	if err != nil {
		t.Fatal(err)
	}
	if c := inbox.CachedInfo().Config; c.MaxBytes != 64<<20 || c.MaxMsgsPerSubject != 3 || c.Discard != jetstream.DiscardOld {
		t.Fatalf("inbox after the update: %+v", c)
	}
	events, err := js.Stream(ctx, engine.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	if c := events.CachedInfo().Config; c.MaxBytes != 32<<20 || c.Discard != jetstream.DiscardOld || c.MaxMsgsPerSubject != -1 {
		t.Fatalf("events after the update: %+v", c)
	}
	// The update applied the new limit to what was stored: a keeps its newest 3.
	for i := 5; i < 7; i++ {
		if _, err := js.Publish(ctx, subjects.Inbox("a"), []byte{byte('0' + i)}); err != nil {
			t.Fatalf("publish into a full inbox: %v", err)
		}
	}
	if _, err := js.Publish(ctx, subjects.Inbox("b"), []byte("b")); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, subj := range []string{subjects.Inbox("a"), subjects.Inbox("b")} {
		c, err := js.OrderedConsumer(ctx, engine.InboxStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
		if err != nil {
			t.Fatal(err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for range info.NumPending {
			m, err := c.Next(jetstream.FetchMaxWait(2 * time.Second))
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, string(m.Data()))
		}
	}
	if !slices.Equal(got, []string{"4", "5", "6", "b"}) {
		t.Fatalf("inbox holds %v, want a's newest three and b's one", got)
	}
	// Heal leaves present streams alone; Provision at start is what updates.
	if healed, err := engine.Heal(ctx, js, limited); err != nil || len(healed) != 0 {
		t.Fatalf("healed %v (%v)", healed, err)
	}
}

// TestProvisionAddsTheHistory: a store made by a version without
// CHIME_HISTORY gains it at the next start, with the record retention as
// its max age, its byte limit (discarding the oldest), direct gets and
// the replicas every stream has; the records there stay as they were.
func TestProvisionAddsTheHistory(t *testing.T) {
	js := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := engine.Provision(ctx, js, topo); err != nil {
		t.Fatal(err)
	}
	// As an earlier version left it: everything but the history.
	if err := js.DeleteStream(ctx, engine.HistoryStream); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, subjects.Inbox("a"), []byte("kept")); err != nil {
		t.Fatal(err)
	}
	withHistory := topo
	withHistory.RecordRetention, withHistory.HistoryMaxBytes = 2*time.Hour, 16<<20
	if _, err := engine.Provision(ctx, js, withHistory); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, engine.HistoryStream)
	if err != nil {
		t.Fatal(err)
	}
	c := s.CachedInfo().Config
	if c.MaxAge != 2*time.Hour || c.MaxBytes != 16<<20 || c.Discard != jetstream.DiscardOld || !c.AllowDirect ||
		c.Replicas != topo.Replicas || c.AllowMsgTTL || !slices.Equal(c.Subjects, []string{engine.HistoryTimers + ".>", engine.HistoryWaits + ".>"}) {
		t.Fatalf("history stream: %+v", c)
	}
	if engine.LimitVar(engine.HistoryStream) != "CHIME_HISTORY_MAX_BYTES" {
		t.Fatalf("the history's limit is named %q", engine.LimitVar(engine.HistoryStream))
	}
	inbox, err := js.Stream(ctx, engine.InboxStream)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := inbox.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("the inbox after the start that added the history: %v %+v", err, info)
	}
}

// TestStreamLimitBeyondTheStore: a size limit larger than the JetStream
// store can reserve refuses to start, saying which variable to lower.
func TestStreamLimitBeyondTheStore(t *testing.T) {
	js := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	huge := topo
	huge.InboxMaxBytes = 1 << 60
	_, err := engine.Provision(ctx, js, huge)
	if err == nil || !strings.Contains(err.Error(), "lower CHIME_INBOX_MAX_BYTES") {
		t.Fatalf("provision with 1 EiB: %v", err)
	}
}

// TestProvisionEnablesTTLsInPlace: record buckets made before records
// expired (no per-message TTLs) are changed in place, keeping their
// records; the healer re-creates them with TTLs too.
func TestProvisionEnablesTTLsInPlace(t *testing.T) {
	js := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, b := range []string{engine.TimersBucket, engine.WaitsBucket, engine.TriggersBucket} {
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b, History: 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, "a.old", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	res, err := engine.Provision(ctx, js, topo)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range []jetstream.KeyValue{res.Timers.KVs[0], res.Waits.KVs[0], res.Triggers} {
		s, err := js.Stream(ctx, "KV_"+kv.Bucket())
		if err != nil {
			t.Fatal(err)
		}
		if c := s.CachedInfo().Config; !c.AllowMsgTTL || c.SubjectDeleteMarkerTTL != engine.DefaultMarkerTTL {
			t.Errorf("%s: allow_msg_ttl %v, marker TTL %v", kv.Bucket(), c.AllowMsgTTL, c.SubjectDeleteMarkerTTL)
		}
		if _, err := kv.Get(ctx, "a.old"); err != nil {
			t.Errorf("%s lost its record: %v", kv.Bucket(), err)
		}
	}
	if err := js.DeleteKeyValue(ctx, engine.WaitsBucket); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.Heal(ctx, js, topo); err != nil {
		t.Fatal(err)
	}
	if s, err := js.Stream(ctx, "KV_"+engine.WaitsBucket); err != nil || !s.CachedInfo().Config.AllowMsgTTL {
		t.Fatalf("healed waits bucket: %v", err)
	}
}

// TestEmbeddedResponderMayOnlyReply: with authorization on, the
// responder's connection may subscribe to the request subjects and publish
// into inboxes, and the server refuses it everything else; chime's own
// connection, under its private inbox prefix, provisions as before.
func TestEmbeddedResponderMayOnlyReply(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	issuer, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := issuer.PublicKey()
	auth := &engine.EmbeddedAuth{
		Password: "svc-pass", Issuer: pub, ResponderPassword: "resp-pass",
		ResponderPublish: access.ResponderPublish(), ResponderSubscribe: access.ResponderSubscribe(api.Rights()),
	}
	log := slog.New(slog.DiscardHandler)
	ns, err := engine.StartEmbedded(ctx, engine.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: t.TempDir(), Auth: auth}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })

	nc, err := engine.Connect(engine.ConnectOptions{
		Embedded: ns, User: engine.ServiceUser, Password: auth.Password, InboxPrefix: access.ServiceInboxPrefix,
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	if _, err := engine.Provision(ctx, js, topo); err != nil {
		t.Fatalf("provision under %s: %v", access.ServiceInboxPrefix, err)
	}

	errs := make(chan error, 16)
	resp, err := nats.Connect(ns.ClientURL(), nats.UserInfo(engine.ResponderUser, auth.ResponderPassword),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(resp.Close)
	requests, err := resp.SubscribeSync(subjects.AgentWildcard(subjects.ActionTimerCreate))
	if err != nil {
		t.Fatal(err)
	}
	if err := resp.Flush(); err != nil {
		t.Fatal(err)
	}
	// A request reaches it, and its answer reaches the requester's inbox.
	go func() {
		m, err := requests.NextMsg(10 * time.Second)
		if err == nil {
			_ = m.Respond([]byte(`{}`))
		}
	}()
	if _, err := nc.Request(subjects.Agent("alice", subjects.ActionTimerCreate), nil, time.Second); err == nil {
		t.Fatal("chime's own connection, under its private prefix, got an answer from the responder")
	}
	select {
	case err := <-errs:
		if !strings.Contains(err.Error(), "Permissions Violation for Publish to \""+access.ServiceInboxPrefix+".") {
			t.Fatalf("an answer into chime's inbox: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("an answer into chime's inbox: no violation")
	}
	opReq, err := nats.Connect(ns.ClientURL(), nats.UserInfo(engine.ServiceUser, auth.Password))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(opReq.Close)
	go func() {
		m, err := requests.NextMsg(10 * time.Second)
		if err == nil {
			_ = m.Respond([]byte(`{}`))
		}
	}()
	if _, err := opReq.Request(subjects.Agent("alice", subjects.ActionTimerCreate), nil, 10*time.Second); err != nil {
		t.Fatalf("a request answered into _INBOX: %v", err)
	}
	for _, subj := range []string{"$KV." + engine.TokensBucket + ".tok.x", subjects.Inbox("bob"), subjects.TimerFire} {
		if err := resp.Publish(subj, []byte("x")); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-errs:
			if !strings.Contains(err.Error(), "Permissions Violation for Publish to \""+subj+"\"") {
				t.Fatalf("publish to %s: %v", subj, err)
			}
		case <-ctx.Done():
			t.Fatalf("publish to %s: no violation", subj)
		}
	}
	if _, err := resp.SubscribeSync(subjects.Inbox("bob")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		if !strings.Contains(err.Error(), "Permissions Violation for Subscription to \""+subjects.Inbox("bob")+"\"") {
			t.Fatalf("subscribe: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("subscribe to an inbox: no violation")
	}
}

// TestProvisionLimitsBucketsInPlace: buckets and the object store made
// before without byte limits get theirs in place, discarding new, and
// keep their records, even a bucket that already holds more than its new
// limit: it then refuses what would grow it and drops nothing. The
// leases bucket stays unlimited.
func TestProvisionLimitsBucketsInPlace(t *testing.T) {
	js := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := engine.Provision(ctx, js, topo) // as before: no limits
	if err != nil {
		t.Fatal(err)
	}
	record := strings.Repeat("q", 1000)
	for i := range 40 { // 40 KB, over the 16 KiB limit below
		if _, err := res.Questions.Put(ctx, fmt.Sprintf("a.q%d", i), []byte(record)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := res.TaskOutputs.PutBytes(ctx, "a/t/1", []byte("output")); err != nil {
		t.Fatal(err)
	}
	limited := topo
	limited.MaxBytes = map[string]int64{}
	for _, b := range []string{engine.TimersBucket, engine.WaitsBucket, engine.TasksBucket, engine.TaskOutputsBucket, engine.NotificationsBucket,
		engine.WaitForBucket, engine.IdempotencyBucket, engine.TokensBucket, engine.TriggersBucket, engine.AgentsBucket} {
		limited.MaxBytes[b] = 8 << 20
	}
	limited.MaxBytes[engine.QuestionsBucket] = 16 << 10
	res, err = engine.Provision(ctx, js, limited)
	if err != nil {
		t.Fatal(err)
	}
	for b, want := range limited.MaxBytes {
		name := "KV_" + b
		if b == engine.TaskOutputsBucket {
			name = "OBJ_" + b
		}
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if c := s.CachedInfo().Config; c.MaxBytes != want || c.Discard != jetstream.DiscardNew {
			t.Errorf("%s: max bytes %d discard %v, want %d and new", name, c.MaxBytes, c.Discard, want)
		}
	}
	if s, err := js.Stream(ctx, "KV_"+engine.LeasesBucket); err != nil || s.CachedInfo().Config.MaxBytes != -1 {
		t.Errorf("leases bucket limited: %v", err)
	}
	for i := range 40 {
		if e, err := res.Questions.Get(ctx, fmt.Sprintf("a.q%d", i)); err != nil || string(e.Value()) != record {
			t.Fatalf("question %d after the limit: %v", i, err)
		}
	}
	if b, err := res.TaskOutputs.GetBytes(ctx, "a/t/1"); err != nil || string(b) != "output" {
		t.Fatalf("task output after the limit: %q %v", b, err)
	}
	// Over its limit: a new record is refused, an update no larger and a
	// removal go through.
	if _, err := res.Questions.Create(ctx, "b.q0", []byte("new")); !errors.Is(storefull.Of(err), storefull.ErrBucketFull) {
		t.Fatalf("create in a bucket over its limit: %v, want the bucket full", err)
	}
	if _, err := res.Questions.Put(ctx, "a.q0", []byte(strings.Repeat("r", 1000))); err != nil {
		t.Fatalf("same-size update in a full bucket: %v", err)
	}
	if err := res.Questions.Delete(ctx, "a.q1"); err != nil {
		t.Fatalf("removal in a full bucket: %v", err)
	}
}

// TestBucketLimitBeyondTheStore: a bucket's byte limit that the JetStream
// store cannot reserve refuses to start, naming the variable to lower.
func TestBucketLimitBeyondTheStore(t *testing.T) {
	ns := natstest.SmallServer(t, 64<<20)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for bucket, v := range map[string]string{engine.TasksBucket: "CHIME_TASKS_MAX_BYTES", engine.TaskOutputsBucket: "CHIME_TASK_OUTPUTS_MAX_BYTES"} {
		big := topo
		big.MaxBytes = map[string]int64{bucket: 1 << 30}
		_, err := engine.Provision(ctx, js, big)
		if err == nil || !strings.Contains(err.Error(), "lower "+v) {
			t.Errorf("provision with %s at 1 GiB in a 64 MiB store: %v", bucket, err)
		}
	}
}

// TestPermissionViolationsLoggedOncePerInterval: a flood of refused
// publishes (replies aimed where the responder may not publish) is one log
// line, not one each.
func TestPermissionViolationsLoggedOncePerInterval(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	issuer, _ := nkeys.CreateAccount()
	pub, _ := issuer.PublicKey()
	auth := &engine.EmbeddedAuth{
		Password: "svc-pass", Issuer: pub, ResponderPassword: "resp-pass",
		ResponderPublish: access.ResponderPublish(), ResponderSubscribe: access.ResponderSubscribe(api.Rights()),
	}
	ns, err := engine.StartEmbedded(ctx, engine.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: t.TempDir(), Auth: auth}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	// A file: the connection's handler writes from its own goroutine.
	logFile, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	logs := func() string { b, _ := os.ReadFile(logFile.Name()); return string(b) }
	resp, err := engine.Connect(engine.ConnectOptions{URL: ns.ClientURL(), User: engine.ResponderUser, Password: auth.ResponderPassword},
		slog.New(slog.NewTextHandler(logFile, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(resp.Close)
	for i := range 200 {
		if err := resp.Publish(fmt.Sprintf("$KV.chime_tokens.tok.%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := resp.Flush(); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 5*time.Second, func() bool { return strings.Contains(logs(), "nats permission violations") }, "the violations logged")
	time.Sleep(200 * time.Millisecond) // the rest of the flood arrives
	if n := strings.Count(logs(), `msg="nats permission violations"`); n != 1 {
		t.Errorf("%d log lines for 200 violations, want 1:\n%s", n, logs())
	}
}

// TestStartFailuresSayWhy: the failures a fresh machine meets each come
// back at once as one error naming the cause and the setting to change:
// the NATS port taken, a data dir that cannot be made, nothing listening
// at CHIME_NATS_URL, and a NATS that refuses chime's credentials.
func TestStartFailuresSayWhy(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	hold, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hold.Close() }()
	_, err = engine.StartEmbedded(ctx, engine.EmbeddedOptions{Listen: hold.Addr().String(), DataDir: t.TempDir()}, log)
	if err == nil || !strings.Contains(err.Error(), "is in use") || !strings.Contains(err.Error(), "CHIME_NATS_LISTEN") {
		t.Fatalf("port in use: %v", err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = engine.StartEmbedded(ctx, engine.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: filepath.Join(file, "data")}, log)
	if err == nil || !strings.Contains(err.Error(), "not a directory") || !strings.Contains(err.Error(), "CHIME_DATA_DIR") {
		t.Fatalf("data dir under a file: %v", err)
	}

	refused := hold.Addr().String()
	_ = hold.Close()
	_, err = engine.Connect(engine.ConnectOptions{URL: "nats://u:secret@" + refused}, log)
	if err == nil || !strings.Contains(err.Error(), "no NATS server answered at nats://"+refused+" (CHIME_NATS_URL): connect: connection refused") ||
		strings.Contains(err.Error(), "secret") {
		t.Fatalf("nothing listening: %v", err)
	}
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, Authorization: "right", NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(5 * time.Second) {
		t.Fatal("server not ready")
	}
	_, err = engine.Connect(engine.ConnectOptions{URL: ns.ClientURL(), Token: "wrong"}, log)
	if err == nil || !strings.Contains(err.Error(), "refused chime's credentials") || !strings.Contains(err.Error(), "CHIME_NATS_TOKEN") {
		t.Fatalf("wrong token: %v", err)
	}
}
