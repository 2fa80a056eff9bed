package replica_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/notifications"
	"github.com/chime-nats/chime/replica"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// fill publishes to a stream of the test's own (not chime's) until the
// JetStream store refuses: the store is then full for every stream.
func fill(ctx context.Context, t *testing.T, js jetstream.JetStream) {
	t.Helper()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FILLER", Subjects: []string{"filler.>"}}); err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte("x"), 256<<10)
	for i := 0; ; i++ {
		if i > 1000 {
			t.Fatal("the store never filled")
		}
		if _, err := js.Publish(ctx, fmt.Sprintf("filler.%d", i), chunk); err != nil {
			t.Logf("store full after %d filler messages: %v", i, err)
			return
		}
	}
}

// httpDo sends a request to the replica's gateway and returns the status
// and the body.
func httpDo(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestStorageFull fills the JetStream store with a stream that is not
// chime's: creates over NATS and HTTP answer storage_full (507), /readyz
// says why, chime_storage_full is 1; once the filler is deleted chime
// recovers without a restart and everything stored before is still there,
// the timer due while the store was full included.
func TestStorageFull(t *testing.T) {
	ns := natstest.SmallServer(t, 24<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	r, err := replica.Start(ctx, &config.Config{
		NATSURL: ns.ClientURL(), JSReplicas: 1, HTTPAddr: "127.0.0.1:0", ReplicaID: "full", Shards: 4,
		LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour, DedupWindow: time.Minute,
		NotificationsMax: 100, RecordRetention: time.Hour, TasksMaxBytes: 1 << 20,
	}, slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})), "0.0.0-test")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop(context.Background())
	base := "http://" + r.HTTPAddr()

	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	c, _ := client.New(nc, "demo")
	var (
		mu        sync.Mutex
		delivered []time.Time
	)
	sub, err := c.SubscribeInbox(func(subjects.Envelope) { mu.Lock(); delivered = append(delivered, time.Now()); mu.Unlock() })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	// What is stored before the store fills, and must still be there.
	long, err := c.CreateTimer(ctx, int64(time.Hour/time.Millisecond), 0, "kept")
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.StartTask(ctx, "t-before", "before the store filled")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Notify(ctx, client.Notification{ID: "n-before", Message: "before"}); err != nil {
		t.Fatal(err)
	}
	// Due while the store is full: its fire waits, and comes once there
	// is room again.
	due, err := c.CreateTimer(ctx, 3000, 0, "due while full")
	if err != nil {
		t.Fatal(err)
	}

	fill(ctx, t, js)
	fullAt := time.Now()

	// Over NATS: the specific error, at once rather than at the deadline.
	for _, tc := range []struct {
		name string
		do   func(context.Context) error
	}{
		{"timer create", func(ctx context.Context) error { _, err := c.CreateTimer(ctx, 60000, 0, "refused"); return err }},
		{"task start", func(ctx context.Context) error { _, err := c.StartTask(ctx, "t-full", "refused"); return err }},
		{"notify", func(ctx context.Context) error {
			_, err := c.Notify(ctx, client.Notification{ID: "n-full", Message: "refused"})
			return err
		}},
	} {
		rctx, rcancel := context.WithTimeout(ctx, 15*time.Second)
		start := time.Now()
		err := tc.do(rctx)
		rcancel()
		took := time.Since(start)
		t.Logf("%s over NATS with the store full: %v (after %v)", tc.name, err, took.Round(time.Millisecond))
		if !errors.Is(err, &subjects.Error{Code: subjects.CodeStorageFull}) {
			t.Errorf("%s: %v, want storage_full", tc.name, err)
		} else if e := subjects.AsError(err); !strings.Contains(e.Message, "full") {
			t.Errorf("%s: message %q does not say the store is full", tc.name, e.Message)
		}
		if took > 5*time.Second {
			t.Errorf("%s answered after %v: a full store is not worth waiting on", tc.name, took)
		}
	}
	// Over HTTP: 507 and the same body.
	code, body := httpDo(t, "POST", base+"/api/control/agents/demo/timers", `{"duration_ms":60000}`)
	t.Logf("timer create over HTTP with the store full: %d %s", code, body)
	if code != http.StatusInsufficientStorage || !strings.Contains(body, `"code":"storage_full"`) {
		t.Errorf("HTTP timer create: %d %s, want 507 storage_full", code, body)
	}
	testwait.Until(t, 10*time.Second, func() (bool, string) {
		code, body := httpDo(t, "GET", base+"/readyz", "")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "storage full"), fmt.Sprint(code, " ", body)
	}, "/readyz saying the store is full")
	testwait.Until(t, 10*time.Second, func() (bool, string) {
		_, m := httpDo(t, "GET", base+"/metrics", "")
		return strings.Contains(m, "\nchime_storage_full 1\n"), metricLines(m, "chime_storage")
	}, "chime_storage_full 1")
	_, m := httpDo(t, "GET", base+"/metrics", "")
	if !strings.Contains(m, `chime_requests_total{endpoint="nats:timer.create",outcome="storage_full"}`) {
		t.Errorf("refused writes not counted by outcome:\n%s", metricLines(m, "chime_requests_total"))
	}
	if !strings.Contains(m, `chime_storage_bucket_limit_bytes{bucket="KV_chime_tasks"} 1.048576e+06`) ||
		!strings.Contains(m, `chime_storage_bucket_bytes{bucket="KV_chime_tasks"}`) {
		t.Errorf("the tasks bucket's size and limit not exported:\n%s", metricLines(m, "chime_storage_bucket"))
	}
	// Hold the store full past the due timer's time: its fire must wait,
	// not be lost.
	time.Sleep(time.Until(fullAt.Add(4 * time.Second)))

	if err := js.DeleteStream(ctx, "FILLER"); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	testwait.Until(t, 15*time.Second, func() (bool, string) {
		code, body := httpDo(t, "GET", base+"/readyz", "")
		return code == http.StatusOK, fmt.Sprint(code, " ", body)
	}, "/readyz back to ok")
	t.Logf("ready again %v after the filler was deleted", time.Since(freed).Round(time.Millisecond))
	_, m = httpDo(t, "GET", base+"/metrics", "")
	if !strings.Contains(m, "\nchime_storage_full 0\n") {
		t.Errorf("chime_storage_full not back to 0:\n%s", metricLines(m, "chime_storage"))
	}
	if _, err := c.CreateTimer(ctx, 60000, 0, "after"); err != nil {
		t.Errorf("timer create after recovery: %v", err)
	}
	if _, err := c.StartTask(ctx, "t-after", "after"); err != nil {
		t.Errorf("task start after recovery: %v", err)
	}
	if code, body := httpDo(t, "POST", base+"/api/control/agents/demo/timers", `{"duration_ms":60000}`); code != http.StatusCreated {
		t.Errorf("HTTP timer create after recovery: %d %s", code, body)
	}

	// Everything stored before is still there, and the due timer fired.
	if got, err := c.GetTimer(ctx, long.ID); err != nil || got.Status != timers.TimerActive {
		t.Errorf("timer stored before: %+v, %v", got, err)
	}
	if got, err := c.GetTask(ctx, task.ID); err != nil || got.ID != task.ID {
		t.Errorf("task stored before: %+v, %v", got, err)
	}
	notes, err := c.Notifications(ctx, nil)
	if err != nil || !hasNotification(notes, "n-before") {
		t.Errorf("notification stored before: %+v, %v", notes, err)
	}
	// The fire is stored in the inbox: its record completed.
	testwait.Until(t, 20*time.Second, func() (bool, string) {
		got, err := c.GetTimer(ctx, due.ID)
		return err == nil && got.Status == timers.TimerCompleted, fmt.Sprintf("%+v %v", got, err)
	}, "the timer due while the store was full fired and completed")
	inbox, err := js.Stream(ctx, "CHIME_INBOX")
	if err != nil {
		t.Fatal(err)
	}
	last, err := inbox.GetLastMsgForSubject(ctx, subjects.Inbox("demo"))
	if err != nil || !strings.Contains(string(last.Data), due.ID) {
		t.Errorf("the inbox's last delivery is not the fire of %s: %v", due.ID, err)
	} else {
		t.Logf("the timer due at +3 s while the store was full is in the inbox, stored %v after it was due (%v after the store was freed)",
			last.Time.Sub(fullAt.Add(3*time.Second)).Round(time.Millisecond), last.Time.Sub(freed).Round(time.Millisecond))
	}
	mu.Lock()
	defer mu.Unlock()
	for _, at := range delivered {
		t.Logf("core inbox delivery at +%v from the fill", at.Sub(fullAt).Round(time.Millisecond))
	}
}

func hasNotification(r *notifications.ListNotificationsReply, id string) bool {
	if r == nil {
		return false
	}
	for _, n := range r.Notifications {
		if n.ID == id {
			return true
		}
	}
	return false
}

// metricLines are the lines of a /metrics body that start with prefix.
func metricLines(m, prefix string) string {
	var out []string
	for l := range strings.SplitSeq(m, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
