package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/natsproc/natsproctest"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/interventions"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waits"
)

// The fault tests run chime against real nats-server processes and lose
// them the way operators do: SIGKILL, restart on the same store, kill the
// leader of a stream. They count from the inbox stream, the one record of
// what agents were given.

// ready reports a replica's /readyz status code (0 when unreachable).
func (p *proc) readyz() int {
	c := http.Client{Timeout: time.Second}
	res, err := c.Get("http://" + p.httpAddr + "/readyz")
	if err != nil {
		return 0
	}
	res.Body.Close()
	return res.StatusCode
}

// metric reads one metric of the replica: a name, with its labels if it
// has any (`name{label="value"}`).
func (p *proc) metric(t *testing.T, name string) float64 {
	t.Helper()
	v, ok := p.metricIf(t, name)
	if !ok {
		t.Fatalf("no metric %s", name)
	}
	return v
}

// metricIf is metric, reporting whether the replica has it.
func (p *proc) metricIf(t *testing.T, name string) (float64, bool) {
	t.Helper()
	res, err := http.Get("http://" + p.httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f, true
		}
	}
	return 0, false
}

// retrying calls fn until it succeeds or ctx ends, riding out the
// `unavailable` answers and timeouts of an engine that is restarting.
func retrying(ctx context.Context, fn func(context.Context) error) error {
	for {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := fn(rctx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		var e *subjects.Error
		if errors.As(err, &e) && e.Code != subjects.CodeUnavailable && e.Code != subjects.CodeInternal {
			return err // a real answer
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tally checks the inbox: every envelope ID once, and per source ID how
// many deliveries of each kind.
type tally struct {
	bySource map[string]int
	byKind   map[string]int
	dups     []string
}

func count(t *testing.T, nc *nats.Conn) tally {
	t.Helper()
	out := tally{bySource: map[string]int{}, byKind: map[string]int{}}
	seen := map[string]bool{}
	for _, d := range inbox(t, nc) {
		if seen[d.env.ID] {
			out.dups = append(out.dups, d.env.ID)
		}
		seen[d.env.ID] = true
		out.bySource[d.env.Source.ID]++
		out.byKind[d.env.Kind]++
	}
	return out
}

// TestNATSServerRestart: a standalone nats-server is SIGKILLed and
// restarted on the same store while two replicas fire 2,000 timers and
// 100 waits. Every one is delivered exactly once without restarting
// chime; /readyz says 503 while chime cannot fire and 200 again by itself.
func TestNATSServerRestart(t *testing.T) {
	srv := natsproctest.Standalone(t)
	env := []string{"CHIME_NATS_URL=" + srv.ClientURL()}
	procs := []*proc{startServe(t, "ra", env...), startServe(t, "rb", env...)}
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	const timers, nWaits, agents = 2000, 100, 8
	start := time.Now()
	var mu sync.Mutex
	timerIDs := map[string]bool{}
	waitIDs := map[string]bool{}
	g, gctx := errgroup.WithContext(ctx)
	for a := range agents {
		c, _ := client.New(nc, fmt.Sprintf("restart-%d", a))
		g.Go(func() error {
			for i := a; i < timers; i += agents {
				// Due from 8 s on, after creation under -race, spread over 6 s.
				at := start.Add(8*time.Second + time.Duration(i)*6*time.Second/timers)
				tm, err := c.CreateTimer(gctx, max(time.Until(at).Milliseconds(), 1), 0, "")
				if err != nil {
					return err
				}
				mu.Lock()
				timerIDs[tm.ID] = true
				mu.Unlock()
			}
			for i := a; i < nWaits; i += agents {
				secs := max(int(time.Until(start.Add(9*time.Second+time.Duration(i%5)*time.Second)).Seconds()), 1)
				var r waits.WaitReply
				if err := c.Request(gctx, waits.ActionWaitRequest, fmt.Appendf(nil, `{"seconds":%d}`, secs), &r); err != nil {
					return err
				}
				mu.Lock()
				waitIDs[r.WaitID] = true
				mu.Unlock()
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("created %d timers and %d waits in %v", len(timerIDs), len(waitIDs), time.Since(start))

	// Kill the server in the middle of the firing.
	eventually(t, 30*time.Second, "a quarter delivered", func() bool { return countInbox(t, nc) >= timers/4 })
	srv.Kill()
	killed := time.Now()
	eventually(t, 15*time.Second, "a replica says not ready", func() bool {
		for _, p := range procs {
			if p.readyz() == http.StatusServiceUnavailable {
				return true
			}
		}
		return false
	})
	time.Sleep(time.Until(killed.Add(2 * time.Second)))
	srv.Restart()
	t.Logf("server down %v", time.Since(killed))
	for _, p := range procs {
		eventually(t, 30*time.Second, p.id+" ready again", func() bool { return p.readyz() == http.StatusOK })
	}
	eventually(t, 60*time.Second, "every timer and wait delivered", func() bool {
		return countInbox(t, nc) >= timers+nWaits
	})
	time.Sleep(time.Second) // let a duplicate show up if there is one
	got := count(t, nc)
	if len(got.dups) > 0 {
		t.Errorf("%d envelopes stored twice, e.g. %s", len(got.dups), got.dups[0])
	}
	lost, twice := 0, 0
	for _, ids := range []map[string]bool{timerIDs, waitIDs} {
		for id := range ids {
			switch got.bySource[id] {
			case 0:
				lost++
			case 1:
			default:
				twice++
			}
		}
	}
	if lost > 0 || twice > 0 || got.byKind[subjects.KindWaitComplete] != nWaits {
		t.Fatalf("lost %d, delivered more than once %d, wait_complete %d of %d", lost, twice, got.byKind[subjects.KindWaitComplete], nWaits)
	}

	// SIGTERM while NATS is down again: a replica still stops within its
	// shutdown limit, and exits 0.
	srv.Kill()
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		select {
		case err := <-p.exited:
			p.exited <- err
			if err != nil {
				t.Errorf("%s exited with %v after SIGTERM", p.id, err)
			}
		case <-time.After(40 * time.Second):
			t.Errorf("%s still running 40 s after SIGTERM with NATS down", p.id)
		}
	}
}

// TestDedupWindowCrossed: SIGKILL mid-burst of 5,000 timers, then a
// downtime longer than the streams' dedup window: occurrences whose
// delivery was stored but whose record was not updated are found in the
// inbox, not delivered again.
func TestDedupWindowCrossed(t *testing.T) {
	dataDir := t.TempDir()
	natsAddr := freeAddr(t)
	env := []string{"CHIME_DATA_DIR=" + dataDir, "CHIME_NATS_LISTEN=" + natsAddr, "CHIME_DEDUP_WINDOW=2s"}
	p := startServe(t, "burst", env...)
	nc, err := nats.Connect("nats://"+natsAddr, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	const timers, agents = 5000, 10
	due := time.Now().Add(12 * time.Second)
	var created atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	for a := range agents {
		c, _ := client.New(nc, fmt.Sprintf("burst-%d", a))
		g.Go(func() error {
			for i := a; i < timers; i += agents {
				if _, err := c.CreateTimer(gctx, max(time.Until(due).Milliseconds(), 1), 0, ""); err != nil {
					return err
				}
				created.Add(1)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if time.Now().After(due) {
		t.Fatalf("creating %d timers outlasted their due time", timers)
	}
	eventually(t, 30*time.Second, "burst under way", func() bool { return countInbox(t, nc) >= 500 })
	p.kill()
	time.Sleep(3 * time.Second) // longer than CHIME_DEDUP_WINDOW
	again := startServe(t, "burst-again", env...)
	eventually(t, 60*time.Second, "every timer delivered", func() bool { return countInbox(t, nc) >= timers })
	time.Sleep(time.Second)
	got := count(t, nc)
	t.Logf("found already delivered after the restart: %v", again.metric(t, "chime_timer_fires_found_delivered_total"))
	if len(got.dups) > 0 || got.byKind[subjects.KindTimerFired] != timers {
		t.Fatalf("%d timer_fired for %d timers; %d envelopes stored twice", got.byKind[subjects.KindTimerFired], timers, len(got.dups))
	}
}

// TestClusterLeaderKills: a 3-node JetStream cluster, chime's streams and
// buckets at R3, three replicas under a steady load of timers and
// cancels. The leaders of CHIME_INBOX and of the timers bucket are killed
// in turn. Nothing is lost or delivered twice; no timer fires more than
// 2 s after its cancel was acknowledged; a callback token revoked during
// the election is refused by every replica from the acknowledgement on;
// no request is answered `internal`.
func TestClusterLeaderKills(t *testing.T) {
	cl := natsproctest.Cluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cl.WaitJetStreamReady(ctx)
	env := []string{"CHIME_NATS_URL=" + cl.URLs(), "CHIME_JS_REPLICAS=3"}
	var procs []*proc
	for _, id := range []string{"c1", "c2", "c3"} {
		procs = append(procs, startServe(t, id, env...))
	}
	nc, err := nats.Connect(cl.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)

	// The callback agent and its current enqueue token.
	cb, _ := client.New(nc, "hooked")
	var token string
	if err := retrying(ctx, func(ctx context.Context) error {
		r, err := cb.Start(ctx)
		if err == nil {
			for _, tr := range r.Triggers {
				if tr.Mode == callbacks.ModeEnqueueMessage {
					token = tr.TriggerURL[strings.LastIndex(tr.TriggerURL, "/")+1:]
				}
			}
		}
		return err
	}); err != nil || token == "" {
		t.Fatalf("start: %v", err)
	}
	post := func(p *proc, tok string) int {
		c := http.Client{Timeout: 2 * time.Second}
		res, err := c.Post("http://"+p.httpAddr+"/api/callbacks/enqueue/"+tok, "text/plain", strings.NewReader("x"))
		if err != nil {
			return 0
		}
		res.Body.Close()
		return res.StatusCode
	}

	// Load: timers due 1.5-3 s after creation; every fourth is cancelled
	// before it is due.
	type record struct {
		cancelled time.Time // when its cancel was acknowledged as cancelled
		completed bool      // its cancel found it completed
		agent     string
		due       time.Time
	}
	var mu sync.Mutex
	created := map[string]*record{}
	var internal, createErrs atomic.Int64
	note := func(err error) {
		var e *subjects.Error
		if errors.As(err, &e) && e.Code == subjects.CodeInternal {
			internal.Add(1)
		}
	}
	loadCtx, stopLoad := context.WithCancel(ctx)
	var load sync.WaitGroup
	for a := range 4 {
		c, _ := client.New(nc, fmt.Sprintf("load-%d", a))
		load.Add(1)
		go func() {
			defer load.Done()
			for i := 0; loadCtx.Err() == nil; i++ {
				rctx, rcancel := context.WithTimeout(loadCtx, 3*time.Second)
				tm, err := c.CreateTimer(rctx, int64(1500+(i*97)%1500), 0, "")
				rcancel()
				if err != nil {
					note(err)
					createErrs.Add(1)
					time.Sleep(50 * time.Millisecond)
					continue
				}
				rec := &record{agent: fmt.Sprintf("load-%d", a), due: *tm.NextFireAt}
				mu.Lock()
				created[tm.ID] = rec
				mu.Unlock()
				if i%4 == 0 {
					time.Sleep(200 * time.Millisecond)
					err := retrying(ctx, func(ctx context.Context) error {
						_, err := c.CancelTimer(ctx, tm.ID)
						note(err)
						return err
					})
					mu.Lock()
					switch {
					case err == nil:
						rec.cancelled = time.Now()
					case errors.Is(err, subjects.ErrTimerCompleted):
						rec.completed = true
					default:
						t.Errorf("cancel %s: %v", tm.ID, err)
					}
					mu.Unlock()
				}
				time.Sleep(40 * time.Millisecond)
			}
		}()
	}

	accepted := 0
	for _, stream := range []string{engine.InboxStream, "KV_" + engine.TimersBucket} {
		time.Sleep(3 * time.Second)
		leader, err := cl.StreamLeader(ctx, js, stream)
		if err != nil {
			t.Fatal(err)
		}
		leader.Kill()
		killed := time.Now()
		// Revoke the token while the election runs; from its
		// acknowledgement on, no replica may take the old one.
		old := token
		if err := retrying(ctx, func(ctx context.Context) error {
			r, err := cb.ResetCallback(ctx, callbacks.ModeEnqueueMessage)
			note(err)
			if err == nil {
				token = r.TriggerURL[strings.LastIndex(r.TriggerURL, "/")+1:]
			}
			return err
		}); err != nil {
			t.Fatalf("reset during the election of %s: %v", stream, err)
		}
		revoked := time.Since(killed)
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			for _, p := range procs {
				if post(p, old) == http.StatusOK {
					accepted++
				}
			}
		}
		newLeader, err := cl.WaitStreamLeader(ctx, js, stream, leader)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: leader %s killed; revoke acknowledged after %v; new leader %s after %v", stream, leader.Name(), revoked, newLeader.Name(), time.Since(killed))
		leader.Restart()
	}
	time.Sleep(3 * time.Second)
	stopLoad()
	load.Wait()
	if accepted > 0 {
		t.Errorf("a revoked token was accepted %d times after its revoke was acknowledged", accepted)
	}
	if n := internal.Load(); n > 0 {
		t.Errorf("%d requests answered internal", n)
	}

	// Everything due has fired; count.
	mu.Lock()
	defer mu.Unlock()
	expected := 0
	for _, r := range created {
		if r.cancelled.IsZero() {
			expected++
		}
	}
	// Not eventually's Fatal: when some never arrive, the lost ones are
	// named below, which is what a failure here must be read by.
	for deadline := time.Now().Add(60 * time.Second); countInbox(t, nc) < expected && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	deliveries := map[string][]time.Time{}
	ids := map[string]int{}
	for _, d := range inbox(t, nc) {
		ids[d.env.ID]++
		if d.env.Kind == subjects.KindTimerFired {
			deliveries[d.env.Source.ID] = append(deliveries[d.env.Source.ID], d.stored)
		}
	}
	dups := 0
	for _, n := range ids {
		if n > 1 {
			dups++
		}
	}
	lost, twice, lateAfterCancel := 0, 0, 0
	for id, r := range created {
		got := deliveries[id]
		if len(got) > 1 {
			twice++
		}
		if r.cancelled.IsZero() {
			if len(got) == 0 {
				lost++
				if lost <= 10 {
					t.Logf("lost: agent %s timer %s due %s", r.agent, id, r.due.Format(time.RFC3339Nano))
				}
			}
			continue
		}
		for _, at := range got {
			if at.Sub(r.cancelled) > 2*time.Second {
				lateAfterCancel++
				t.Logf("fired after its cancel: agent %s timer %s due %s, cancel acknowledged %s, stored %s (%v after)",
					r.agent, id, r.due.Format(time.RFC3339Nano), r.cancelled.Format(time.RFC3339Nano), at.Format(time.RFC3339Nano), at.Sub(r.cancelled))
			}
		}
	}
	t.Logf("%d timers created (%d create errors during elections), %d expected to fire", len(created), createErrs.Load(), expected)
	if lost > 0 || twice > 0 || dups > 0 || lateAfterCancel > 0 {
		t.Fatalf("lost %d, delivered twice %d, envelopes stored twice %d, fired > 2 s after their cancel %d", lost, twice, dups, lateAfterCancel)
	}
}

// TestPublishFailures: the inbox stream refuses every new message for a
// while (full, discard new). Timers, repeating timers and waits due then
// are all delivered once afterwards, each on its original target: a retry
// never becomes a different occurrence.
func TestPublishFailures(t *testing.T) {
	ns := natstest.Server(t)
	p := startServe(t, "pf", "CHIME_NATS_URL="+ns.ClientURL())
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, _ := client.New(nc, "faulty")

	start := time.Now()
	oneShots := map[string]time.Time{}
	for i := range 200 {
		tm, err := c.CreateTimer(ctx, int64(3000+i*10), 0, "")
		if err != nil {
			t.Fatal(err)
		}
		oneShots[tm.ID] = *tm.NextFireAt
	}
	repeating := map[string]time.Time{}
	for range 5 {
		tm, err := c.CreateTimer(ctx, 2500, 500, "")
		if err != nil {
			t.Fatal(err)
		}
		repeating[tm.ID] = *tm.NextFireAt
	}
	waitTargets := map[string]string{}
	for range 20 {
		var r waits.WaitReply
		if err := c.Request(ctx, waits.ActionWaitRequest, []byte(`{"seconds":4}`), &r); err != nil {
			t.Fatal(err)
		}
		waitTargets[r.WaitID] = r.TargetTime
	}

	// From 2 s to 7 s after start the inbox takes nothing new.
	stream, err := js.Stream(ctx, engine.InboxStream)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(start.Add(2 * time.Second)))
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	full := info.Config
	full.MaxMsgs, full.Discard = int64(max(info.State.Msgs, 1)), jetstream.DiscardNew
	if _, err := js.UpdateStream(ctx, full); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "publish failures seen", func() bool { return p.metric(t, "chime_timer_fire_publish_failures_total") > 0 })
	time.Sleep(time.Until(start.Add(7 * time.Second)))
	info.Config.MaxMsgs, info.Config.Discard = -1, jetstream.DiscardOld
	if _, err := js.UpdateStream(ctx, info.Config); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "every one-shot and wait delivered", func() bool {
		got := count(t, nc)
		return got.byKind[subjects.KindWaitComplete] >= len(waitTargets) && got.byKind[subjects.KindTimerFired] >= len(oneShots)+5*4
	})
	time.Sleep(time.Second)

	seen := map[string]bool{}
	occurrences := map[string][]timers.TimerFiredData{}
	for _, d := range inbox(t, nc) {
		if seen[d.env.ID] {
			t.Errorf("envelope %s stored twice", d.env.ID)
		}
		seen[d.env.ID] = true
		switch d.env.Kind {
		case subjects.KindTimerFired:
			occurrences[d.data.TimerID] = append(occurrences[d.data.TimerID], d.data)
		case subjects.KindWaitComplete:
			var w waits.WaitEndData
			if err := json.Unmarshal(d.env.Data, &w); err != nil {
				t.Fatal(err)
			}
			if want, ok := waitTargets[w.WaitID]; !ok || w.TargetTime != want || !strings.Contains(d.env.Text, want) {
				t.Errorf("wait %s completed with %q, want target %s", w.WaitID, d.env.Text, want)
			}
			delete(waitTargets, w.WaitID)
		}
	}
	if len(waitTargets) > 0 {
		t.Errorf("%d waits never completed", len(waitTargets))
	}
	for id, due := range oneShots {
		got := occurrences[id]
		if len(got) != 1 || !got[0].DueAt.Equal(due) || got[0].Occurrence != 1 {
			t.Errorf("one-shot %s: %+v, want one occurrence due %v", id, got, due)
		}
	}
	for id, first := range repeating {
		got := occurrences[id]
		for i, o := range got {
			if o.Occurrence != int64(i+1) {
				t.Errorf("repeating %s: occurrence %d at position %d", id, o.Occurrence, i)
			}
			if off := o.DueAt.Sub(first); off < 0 || off%(500*time.Millisecond) != 0 {
				t.Errorf("repeating %s occurrence %d due %v: off its cadence", id, o.Occurrence, o.DueAt)
			}
		}
	}
	t.Logf("publish failures retried: %v", p.metric(t, "chime_timer_fire_publish_failures_total"))
}

// TestEventsStreamRecreated: CHIME_EVENTS is deleted under a running
// replica (an operator's `nats stream rm`). It comes back by itself, its
// consumers with it, and an agent's interventions apply again although
// the new stream's sequences start over below the agent's cursor.
func TestEventsStreamRecreated(t *testing.T) {
	ns := natstest.Server(t)
	startServe(t, "heal", "CHIME_NATS_URL="+ns.ClientURL())
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, _ := client.New(nc, "healed")
	inbox := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(subjects.Inbox("healed"), inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	expect := func(text string) {
		t.Helper()
		deadline := time.After(15 * time.Second)
		for {
			select {
			case m := <-inbox:
				var env subjects.Envelope
				if json.Unmarshal(m.Data, &env) == nil && env.Kind == subjects.KindIntervention && env.Text == text {
					return
				}
			case <-deadline:
				t.Fatalf("intervention %q never delivered", text)
			}
		}
	}
	// Move the agent's cursor up the old stream.
	for i := range 5 {
		text := fmt.Sprintf("before %d", i)
		if err := c.Intervene(ctx, interventions.ActionMessage, text); err != nil {
			t.Fatal(err)
		}
		expect(text)
	}
	if err := js.DeleteStream(ctx, engine.EventsStream); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "events stream re-created", func() bool {
		_, err := js.Stream(ctx, engine.EventsStream)
		return err == nil
	})
	if err := retrying(ctx, func(ctx context.Context) error { return c.Intervene(ctx, interventions.ActionMessage, "after") }); err != nil {
		t.Fatal(err)
	}
	expect("after")
}
