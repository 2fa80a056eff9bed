package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/replica"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/waits"
)

// metric reads one series of a replica's /metrics, e.g.
// `chime_quota_refusals_total{quota="rate"}`; 0 when absent.
func metric(t *testing.T, r *replica.Replica, series string) float64 {
	t.Helper()
	res, err := http.Get("http://" + r.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}

// settled waits until the replica's index counts n of series (the quotas
// read the index, which follows the buckets a few milliseconds behind).
func settled(t *testing.T, r *replica.Replica, series string, n float64) {
	t.Helper()
	testwait.Until(t, 5*time.Second, func() (bool, string) {
		got := metric(t, r, series)
		return got == n, fmt.Sprint(got)
	}, "%s at %v", series, n)
}

// httpCreate posts a timer create and returns the status, the Retry-After
// header and the body.
func httpCreate(t *testing.T, r *replica.Replica, agent, body string) (int, string, []byte) {
	t.Helper()
	res, err := http.Post("http://"+r.HTTPAddr()+"/api/control/agents/"+agent+"/timers", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header.Get("Retry-After"), b
}

func countTimers(t *testing.T, c *client.Client) int {
	t.Helper()
	list, err := c.ListTimers(context.Background(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	return len(list)
}

// TestQuotas: an agent at its active timers or waits, or asking for a
// repeat shorter than the minimum, is refused with its own code and text
// over NATS and HTTP, nothing is stored, other agents are not touched, and
// each refusal is counted by quota. In both record layouts: counted by
// every replica's watches, or summed from the counts bucket.
func TestQuotas(t *testing.T) {
	for _, partitions := range []int{0, 3} {
		t.Run("partitions="+strconv.Itoa(partitions), func(t *testing.T) { testQuotas(t, partitions) })
	}
}

func testQuotas(t *testing.T, partitions int) {
	r, nc := startChimeWith(t, io.Discard, func(c *config.Config) {
		c.MaxTimersPerAgent, c.MaxWaitsPerAgent, c.MinInterval = 3, 2, time.Second
		c.Partitions = partitions
	})
	ctx := context.Background()
	c, _ := client.New(nc, "full")
	for range 3 {
		if _, err := c.CreateTimer(ctx, 3_600_000, 0, ""); err != nil {
			t.Fatal(err)
		}
	}
	settled(t, r, "chime_timers_active", 3)
	settled(t, r, "chime_counts_pending", 0)

	const timerText = "agent full has 3 active timers; at most 3 are allowed (CHIME_MAX_TIMERS_PER_AGENT)"
	msg := request(t, nc, "agent.full.timer.create", `{"duration_ms":1000}`)
	assertError(t, "4th timer over NATS", msg.Data, "quota_exceeded", timerText)
	if msg.Header.Get("Nats-Service-Error-Code") != "429" || msg.Header.Get("Retry-After") != "" {
		t.Errorf("quota over NATS: headers %v", msg.Header)
	}
	status, after, body := httpCreate(t, r, "full", `{"duration_ms":1000}`)
	assertError(t, "4th timer over HTTP", body, "quota_exceeded", timerText)
	if status != http.StatusTooManyRequests || after != "" {
		t.Errorf("quota over HTTP: %d, Retry-After %q", status, after)
	}
	if n := countTimers(t, c); n != 3 {
		t.Fatalf("%d timers stored, want 3", n)
	}
	other, _ := client.New(nc, "other")
	if _, err := other.CreateTimer(ctx, 3_600_000, 0, ""); err != nil {
		t.Fatalf("another agent: %v", err)
	}

	// Waits: their own count, their own quota.
	for range 2 {
		if err := c.Request(ctx, waits.ActionWaitRequest, []byte(`{"hours":1}`), &waits.WaitReply{}); err != nil {
			t.Fatal(err)
		}
	}
	settled(t, r, "chime_waits_active", 2)
	settled(t, r, "chime_counts_pending", 0)
	if partitions > 1 {
		countsHold(t, nc, "full", 2)
		// A sum read before the owners flushed the second wait's count is
		// reused for 100 ms (scheduler's countFresh); the quota is exact
		// once it is read again.
		time.Sleep(150 * time.Millisecond)
	}
	msg = request(t, nc, "agent.full.wait.request", `{"hours":1,"id":"third"}`)
	assertError(t, "3rd wait", msg.Data, "quota_exceeded", "agent full has 2 waiting waits; at most 2 are allowed (CHIME_MAX_WAITS_PER_AGENT)")
	if msg.Header.Get("Nats-Service-Error-Code") != "429" {
		t.Errorf("wait quota: headers %v", msg.Header)
	}
	if err := c.Request(ctx, waits.ActionWaitCancel, []byte(`{"wait_id":"third"}`), &waits.Wait{}); !errors.Is(err, waits.ErrWaitNotFound) {
		t.Fatalf("the refused wait was stored: %v", err)
	}

	// A 1 ms repeat (what the attacker used) and one just short of the minimum.
	for _, body := range []string{`{"duration_ms":1000,"interval_ms":1}`, `{"duration_ms":1000,"interval_ms":999}`} {
		assertError(t, body, request(t, nc, "agent.fast.timer.create", body).Data, "invalid_request", "interval_ms must be at least 1000")
		status, _, b := httpCreate(t, r, "fast", body)
		assertError(t, body, b, "invalid_request", "interval_ms must be at least 1000")
		if status != http.StatusBadRequest {
			t.Errorf("%s over HTTP: %d", body, status)
		}
	}
	fast, _ := client.New(nc, "fast")
	if n := countTimers(t, fast); n != 0 {
		t.Fatalf("%d short-interval timers stored", n)
	}
	if _, err := fast.CreateTimer(ctx, 1000, 1000, ""); err != nil {
		t.Fatalf("the minimum itself: %v", err)
	}

	for quota, want := range map[string]float64{"timers": 2, "waits": 1, "interval": 4, "rate": 0} {
		if got := metric(t, r, `chime_quota_refusals_total{quota="`+quota+`"}`); got != want {
			t.Errorf("refusals of %s: %v, want %v", quota, got, want)
		}
	}
	if got := metric(t, r, `chime_requests_total{endpoint="nats:timer.create",outcome="quota_exceeded"}`); got != 1 {
		t.Errorf("requests counted as quota_exceeded: %v", got)
	}
}

// TestCreateRate: past its burst an agent's timer creates and wait requests
// are refused rate_limited with Retry-After over NATS and HTTP, nothing is
// stored, and other agents keep their own budget.
func TestCreateRate(t *testing.T) {
	// 0.01 a second: no token comes back while the test runs.
	r, nc := startChimeWith(t, io.Discard, func(c *config.Config) { c.CreateRate, c.CreateBurst = 0.01, 3 })
	ctx := context.Background()
	c, _ := client.New(nc, "eager")
	for range 2 {
		if _, err := c.CreateTimer(ctx, 3_600_000, 0, ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Request(ctx, waits.ActionWaitRequest, []byte(`{"hours":1}`), &waits.WaitReply{}); err != nil {
		t.Fatal(err)
	}
	// The next token is about 100 s away (less what the test took).
	refused := func(what string, body []byte, after string) {
		t.Helper()
		err := subjects.DecodeReply(body, &struct{}{})
		if e := subjects.AsError(err); e.Code != subjects.CodeRateLimited ||
			!strings.HasPrefix(e.Message, "agent eager is creating timers and waits faster than 0.01 a second (CHIME_CREATE_RATE); retry in ") {
			t.Errorf("%s: %v", what, err)
		}
		if s, err := strconv.Atoi(after); err != nil || s < 90 || s > 100 {
			t.Errorf("%s: Retry-After %q", what, after)
		}
	}
	for _, subject := range []string{"agent.eager.timer.create", "agent.eager.wait.request"} {
		body := `{"duration_ms":1000}`
		if strings.HasSuffix(subject, "wait.request") {
			body = `{"hours":1}`
		}
		msg := request(t, nc, subject, body)
		refused(subject, msg.Data, msg.Header.Get("Retry-After"))
		if msg.Header.Get("Nats-Service-Error-Code") != "429" {
			t.Errorf("%s: headers %v", subject, msg.Header)
		}
	}
	status, after, body := httpCreate(t, r, "eager", `{"duration_ms":1000}`)
	refused("HTTP", body, after)
	if status != http.StatusTooManyRequests {
		t.Errorf("HTTP: %d", status)
	}
	if n := countTimers(t, c); n != 2 {
		t.Fatalf("%d timers stored, want 2", n)
	}
	// Other agents have their own budget.
	other, _ := client.New(nc, "calm")
	for range 3 {
		if _, err := other.CreateTimer(ctx, 3_600_000, 0, ""); err != nil {
			t.Fatalf("another agent: %v", err)
		}
	}
	if got := metric(t, r, `chime_quota_refusals_total{quota="rate"}`); got != 3 {
		t.Errorf("rate refusals: %v, want 3", got)
	}
}

// TestRetryAtQuotaReplays: a retried create (same request_id) is answered
// with its record even when the agent is at its quota or over its rate;
// a new create is still refused.
func TestRetryAtQuotaReplays(t *testing.T) {
	r, nc := startChimeWith(t, io.Discard, func(c *config.Config) {
		c.MaxTimersPerAgent, c.MaxWaitsPerAgent, c.CreateRate, c.CreateBurst = 2, 1, 0.001, 3
	})
	c, _ := client.New(nc, "full")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	first, err := c.CreateTimer(ctx, 3_600_000, 0, "", client.WithRequestID("r1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateTimer(ctx, 3_600_000, 0, "", client.WithRequestID("r2")); err != nil {
		t.Fatal(err)
	}
	settled(t, r, `chime_timers_active`, 2)
	again, err := c.CreateTimer(ctx, 3_600_000, 0, "", client.WithRequestID("r1"))
	if err != nil || again.ID != first.ID {
		t.Fatalf("retry at quota: %+v %v", again, err)
	}
	if _, err := c.CreateTimer(ctx, 3_600_000, 0, "", client.WithRequestID("r3")); !errors.Is(err, subjects.ErrQuotaExceeded) {
		t.Fatalf("new create at quota: %v", err)
	}
	// The burst is spent: a retry still replays, a new request is paced.
	for range 3 {
		if again, err = c.CreateTimer(ctx, 3_600_000, 0, "", client.WithRequestID("r1")); err != nil || again.ID != first.ID {
			t.Fatalf("retry over the rate: %+v %v", again, err)
		}
	}
	if _, err := c.CreateTimer(ctx, 3_600_000, 0, "", client.WithRequestID("r4")); !errors.Is(err, subjects.ErrRateLimited) {
		t.Fatalf("new create over the rate: %v", err)
	}
}

// countsHold waits until the sharded layout's stored counts (chime_counts,
// which the quota reads) hold the agent's waits: the pending gauge can read
// 0 before the owners have taken a new record in.
func countsHold(t *testing.T, nc *nats.Conn, agentID string, waits int) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, "chime_counts")
	if err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 5*time.Second, func() (bool, string) {
		keys, err := kv.ListKeysFiltered(ctx, agentID+".*")
		if err != nil {
			return false, err.Error()
		}
		sum := 0
		for k := range keys.Keys() {
			e, err := kv.Get(ctx, k)
			if err != nil {
				continue
			}
			var n struct {
				Waits int `json:"waits"`
			}
			if json.Unmarshal(e.Value(), &n) == nil {
				sum += n.Waits
			}
		}
		return sum == waits, fmt.Sprint(sum)
	}, "the stored counts of %s at %d waits", agentID, waits)
}
