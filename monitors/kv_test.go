package monitors_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/monitors"
	"github.com/chime-nats/chime/subjects"
)

// newKVEnv is newEnvWith serving the kv source under the operator's
// patterns allow, on the test's clock, paced loosely enough that no test
// line is suppressed, with a bucket "builds" to watch.
func newKVEnv(t *testing.T, allow ...string) (*env, jetstream.KeyValue, monitors.KVPolicy) {
	t.Helper()
	e := newEnvWith(t, 0, monitors.SubjectPolicy{}, time.Now)
	policy, err := monitors.NewKVPolicy(e.res.JS, allow)
	if err != nil {
		t.Fatal(err)
	}
	e.store = monitors.NewStore(monitors.Config{
		KV: e.res.Monitors, JS: e.res.JS, Inbox: consumer.NewInbox(e.res.JS, engine.InboxStream, 2*time.Minute, nil),
		Now: time.Now, Retention: kvrec.Retention{JS: e.res.JS, After: time.Hour, Markers: time.Minute},
		Count: e.index, Pace: monitors.Pace{Rate: 1e6, Burst: 1_000_000},
		Sources: map[string]monitors.Checker{monitors.SourceKV: policy},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := e.res.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "builds", History: 5})
	if err != nil {
		t.Fatal(err)
	}
	return e, kv, policy
}

// kvWatcher runs a watcher of the kv source for owner o until the test ends.
func kvWatcher(t *testing.T, e *env, o monitors.Owner) *monitors.Watcher {
	t.Helper()
	w := monitors.NewWatcher(monitors.WatcherConfig{
		Feeds: map[string]monitors.Feed{monitors.SourceKV: monitors.KVFeed{JS: e.res.JS, CheckEvery: 200 * time.Millisecond}},
		Store: e.store, Index: e.index, Leases: o, Shards: 8, Every: 20 * time.Millisecond,
	})
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	return w
}

// kvLines are the lines of the agent's monitor_event envelopes, in the
// inbox's order; it fails on an envelope stored twice.
func kvLines(t *testing.T, e *env, agentID string) []string {
	t.Helper()
	var out []string
	ids := map[string]bool{}
	for _, env := range e.inbox(t, agentID, subjects.KindMonitorEvent) {
		if ids[env.ID] {
			t.Fatalf("envelope %s stored twice", env.ID)
		}
		ids[env.ID] = true
		var d monitors.EventData
		if err := json.Unmarshal(env.Data, &d); err != nil {
			t.Fatal(err)
		}
		out = append(out, d.Lines...)
	}
	return out
}

// TestKVPolicyRefusesWhatIsNotOpen: an agent names buckets and keys
// outside the operator's patterns, another agent's space, chime's own
// buckets, and malformed names: each is refused with its code and a
// message saying why; what the operator opens is allowed.
func TestKVPolicyRefusesWhatIsNotOpen(t *testing.T) {
	p, err := monitors.NewKVPolicy(nil, []string{"builds/ci.>", " team/{agent}.> ", "cfg/app.*.flags", ""})
	if err != nil {
		t.Fatal(err)
	}
	for _, ok := range []string{"builds/ci.x", "builds/ci.>", "builds/ci.*.status", "builds/ci.a/b=c", "team/a1.x", "team/a1.>", "cfg/app.web.flags", "cfg/app.*.flags"} {
		if err := p.Check("a1", ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, tc := range []struct{ value, code, text string }{
		{"builds/>", monitors.CodeKVNotAllowed, "not within the keys open to monitors (CHIME_MONITOR_KV: builds/ci.>, team/{agent}.>, cfg/app.*.flags)"},
		{"builds/cd.x", monitors.CodeKVNotAllowed, "not within"},
		{"other/ci.x", monitors.CodeKVNotAllowed, "not within"},
		{"team/a2.x", monitors.CodeKVNotAllowed, "not within"},
		{"team/*.x", monitors.CodeKVNotAllowed, "not within"},
		{"team/>", monitors.CodeKVNotAllowed, "not within"},
		{"cfg/app.>", monitors.CodeKVNotAllowed, "not within"},
		{"chime_tokens/tok.>", monitors.CodeKVNotAllowed, "chime's own"},
		{"chime_monitors/a2.>", monitors.CodeKVNotAllowed, "chime's own"},
		{"chime_agents/a1", monitors.CodeKVNotAllowed, "chime's own"},
		{"CHIME_x/k", monitors.CodeKVNotAllowed, "chime's own"},
		{"chimera/k", monitors.CodeKVNotAllowed, "chime's own"},
		{"builds", subjects.CodeInvalidRequest, "must be <bucket>/<key>"},
		{"builds/", subjects.CodeInvalidRequest, "must be <bucket>/<key>"},
		{"/ci.x", subjects.CodeInvalidRequest, "must be <bucket>/<key>"},
		{"bu.ilds/ci.x", subjects.CodeInvalidRequest, "not a valid bucket name"},
		{"b*/ci.x", subjects.CodeInvalidRequest, "not a valid bucket name"},
		{"builds/ci..x", subjects.CodeInvalidRequest, "not a valid key pattern"},
		{"builds/ci.>.x", subjects.CodeInvalidRequest, "not a valid key pattern"},
		{"builds/ci.a b", subjects.CodeInvalidRequest, "not a valid key pattern"},
		{"builds/.ci", subjects.CodeInvalidRequest, "not a valid key pattern"},
		{"builds/ci.x*", subjects.CodeInvalidRequest, "not a valid key pattern"},
		{strings.Repeat("b", 65) + "/k", subjects.CodeInvalidRequest, "at most 64 bytes"},
		{"builds/ci." + strings.Repeat("x", 300), subjects.CodeInvalidRequest, "at most 256 bytes"},
	} {
		err := p.Check("a1", tc.value)
		var wire *subjects.Error
		if !errors.As(err, &wire) || wire.Code != tc.code || !strings.Contains(wire.Message, tc.text) {
			t.Errorf("%s: %v, want %s %q", tc.value, err, tc.code, tc.text)
		}
		if tc.code == monitors.CodeKVNotAllowed && wire != nil && wire.Status != 403 {
			t.Errorf("%s: status %d", tc.value, wire.Status)
		}
	}
	// No pattern allowed: nothing is.
	none, _ := monitors.NewKVPolicy(nil, nil)
	var wire *subjects.Error
	if err := none.Check("a1", "builds/ci.x"); !errors.As(err, &wire) || wire.Code != monitors.CodeKVNotAllowed ||
		!strings.Contains(wire.Message, "CHIME_MONITOR_KV is empty") {
		t.Fatalf("the zero policy: %v", err)
	}
	// An operator's pattern opening chime's buckets, or malformed, fails at start.
	for _, bad := range []string{"chime_tokens/>", "chime_monitors/{agent}.>", "chime_x/k", "builds", "builds/ci..x", "b.x/k", "{agent}/>x"} {
		if _, err := monitors.NewKVPolicy(nil, []string{bad}); err == nil {
			t.Errorf("allowed pattern %q accepted", bad)
		}
	}
}

// TestKVMonitorDeliversChanges: the changes of the watched keys become
// lines "<key> <op> <value>" in their order, from the monitor's start on
// (not the values already there); keys outside the pattern are not
// watched; match and exclude apply; the record's cursor is the last
// revision counted; a bucket that does not exist is refused at start.
func TestKVMonitorDeliversChanges(t *testing.T) {
	e, kv, _ := newKVEnv(t, "builds/ci.>")
	ctx := context.Background()
	if _, err := kv.PutString(ctx, "ci.old", "before the start"); err != nil {
		t.Fatal(err)
	}
	var wire *subjects.Error
	if _, err := e.store.Start(ctx, "a1", mustSpec(t, `{"description":"d","kv":"builds/cd.>"}`)); !errors.As(err, &wire) || wire.Code != monitors.CodeKVNotAllowed {
		t.Fatalf("outside the patterns: %v", err)
	}
	m := start(t, e, "a1", `{"description":"CI","kv":"builds/ci.>","exclude":"noise"}`)
	if m.Cursor != "1" {
		t.Fatalf("initial cursor %q, want the bucket's last revision 1", m.Cursor)
	}
	o := &owner{}
	o.all.Store(true)
	kvWatcher(t, e, o)
	put := func(k, v string) {
		t.Helper()
		if _, err := kv.PutString(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	put("ci.a", "one")
	put("cd.a", "not watched")
	put("ci.b", "noise")
	put("ci.a/x", "two\nlines")
	if err := kv.Delete(ctx, "ci.a"); err != nil {
		t.Fatal(err)
	}
	// A purge removes the key's earlier revisions: read them first.
	testwait.Until(t, 10*time.Second, func() (bool, string) {
		got, err := e.store.Get(ctx, "a1", m.ID)
		return err == nil && got.Events == 3 && got.Filtered == 1, fmt.Sprintf("%+v %v", got, err)
	})
	if err := kv.Purge(ctx, "ci.b"); err != nil {
		t.Fatal(err)
	}
	put("ci.c", "last")
	want := []string{"ci.a PUT one", `ci.a/x PUT two\nlines`, "ci.a DEL", "ci.b PURGE", "ci.c PUT last"}
	testwait.Until(t, 10*time.Second, func() (bool, string) {
		got := kvLines(t, e, "a1")
		return strings.Join(got, "|") == strings.Join(want, "|"), fmt.Sprintf("lines %q", got)
	})
	rec, err := e.store.Get(ctx, "a1", m.ID)
	if err != nil || rec.Cursor != "8" || rec.Events != 5 || rec.Filtered != 1 {
		t.Fatalf("record: %+v %v", rec, err)
	}
	if _, err := e.store.Start(ctx, "a1", mustSpec(t, `{"description":"d","kv":"nobucket/ci.x"}`)); err == nil {
		t.Fatal("a bucket that does not exist")
	}
	p, _ := monitors.NewKVPolicy(e.res.JS, []string{"nobucket/>"})
	if _, err := p.Start(ctx, "a1", "nobucket/x"); !errors.As(err, &wire) || wire.Code != monitors.CodeKVBucketNotFound {
		t.Fatalf("a bucket that does not exist: %v", err)
	}
}

// TestKVMonitorStartRace: a change made right after monitor.start
// returns, before any replica watches, is delivered; the value the key
// had before the start is not.
func TestKVMonitorStartRace(t *testing.T) {
	e, kv, _ := newKVEnv(t, "builds/>")
	ctx := context.Background()
	o := &owner{}
	o.all.Store(true)
	w := kvWatcher(t, e, o)
	for i := range 5 {
		key := fmt.Sprintf("k%d", i)
		if _, err := kv.PutString(ctx, key, "before"); err != nil {
			t.Fatal(err)
		}
		m := start(t, e, "a1", fmt.Sprintf(`{"description":"d%d","kv":"builds/%s"}`, i, key))
		if _, err := kv.PutString(ctx, key, "right after"); err != nil {
			t.Fatal(err)
		}
		testwait.Until(t, 10*time.Second, func() (bool, string) {
			got, err := e.store.Get(ctx, "a1", m.ID)
			return err == nil && got.Events >= 1, fmt.Sprintf("%+v %v (watching %d)", got, err, w.Watching())
		})
		if got := kvLines(t, e, "a1"); len(got) != i+1 || got[i] != key+" PUT right after" {
			t.Fatalf("lines %q", got)
		}
	}
}

// TestKVMonitorMovesWithoutLossOrRepeat: two replicas' watchers, whose
// shards flip between them, now one, now both, now neither, while a
// writer changes the watched keys: every change is delivered exactly
// once, in order, those made while no one watched included. (Each
// change is to its own key: a bucket keeps only its History revisions a
// key, and a watch behind sees only those.)
func TestKVMonitorMovesWithoutLossOrRepeat(t *testing.T) {
	e, kv, _ := newKVEnv(t, "builds/ci.>")
	ctx := context.Background()
	m := start(t, e, "a1", `{"description":"CI","kv":"builds/ci.>","persistent":true}`)
	o1, o2 := &owner{}, &owner{}
	o1.all.Store(true)
	kvWatcher(t, e, o1)
	kvWatcher(t, e, o2)
	const n = 400
	var written atomic.Int64
	done := make(chan error, 1)
	go func() {
		for i := range n {
			if _, err := kv.PutString(ctx, fmt.Sprintf("ci.k%d", i), fmt.Sprint(i)); err != nil {
				done <- err
				return
			}
			if i%10 == 0 {
				_, _ = kv.PutString(ctx, "other", "not watched")
			}
			written.Add(1)
			time.Sleep(time.Duration(2+rand.IntN(12)) * time.Millisecond)
		}
		done <- nil
	}()
	flips := 0
	for written.Load() < n {
		switch rand.IntN(4) {
		case 0:
			o1.all.Store(!o1.all.Load())
		case 1:
			o2.all.Store(!o2.all.Load())
		case 2:
			o1.all.Store(true)
			o2.all.Store(true)
		default:
			o1.all.Store(false)
			o2.all.Store(false)
		}
		flips++
		time.Sleep(time.Duration(20+rand.IntN(150)) * time.Millisecond)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	o1.all.Store(true)
	o2.all.Store(false)
	var got []string
	testwait.Until(t, 20*time.Second, func() (bool, string) {
		got = kvLines(t, e, "a1")
		return len(got) >= n, fmt.Sprintf("%d lines of %d", len(got), n)
	})
	if len(got) != n {
		t.Fatalf("%d lines for %d changes", len(got), n)
	}
	for i, l := range got {
		if want := fmt.Sprintf("ci.k%d PUT %d", i, i); l != want {
			t.Fatalf("line %d: %q, want %q (after %d flips)", i, l, want, flips)
		}
	}
	rec, err := e.store.Get(ctx, "a1", m.ID)
	if err != nil || rec.Events != n {
		t.Fatalf("record: %+v %v", rec, err)
	}
	t.Logf("%d changes over %d flips in %d batches", n, flips, rec.Batches)
}

// TestKVMonitorEndsWithItsBucket: a deleted bucket ends the monitor,
// source_ended, with one monitor_stopped, after the lines it had.
func TestKVMonitorEndsWithItsBucket(t *testing.T) {
	e, kv, _ := newKVEnv(t, "builds/>")
	ctx := context.Background()
	m := start(t, e, "a1", `{"description":"CI","kv":"builds/>"}`)
	o := &owner{}
	o.all.Store(true)
	w := kvWatcher(t, e, o)
	if _, err := kv.PutString(ctx, "x", "1"); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, func() bool { return len(kvLines(t, e, "a1")) == 1 })
	if err := e.res.JS.DeleteKeyValue(ctx, "builds"); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 10*time.Second, func() (bool, string) {
		got, err := e.store.Get(ctx, "a1", m.ID)
		return err == nil && got.Finished(), fmt.Sprintf("%+v %v", got, err)
	})
	got, _ := e.store.Get(ctx, "a1", m.ID)
	stops := e.inbox(t, "a1", subjects.KindMonitorStopped)
	if got.StopReason != monitors.ReasonSourceEnded || got.Events != 1 || len(stops) != 1 || !strings.Contains(stops[0].Text, "its source ended") {
		t.Fatalf("record %+v, monitor_stopped %+v", got, stops)
	}
	testwait.Eventually(t, 5*time.Second, func() bool { return w.Watching() == 0 })
}

// TestKVMonitorCountsTheStoredBatch: a replica that stored batch 0 and
// died before counting it leaves the inbox holding a batch the record
// does not count; the next holder's batch 0, with more lines, is dropped
// as its repeat: the record then counts where the stored batch ended,
// and the changes after it come in batch 1, none lost or repeated.
func TestKVMonitorCountsTheStoredBatch(t *testing.T) {
	e, kv, _ := newKVEnv(t, "builds/ci.>")
	ctx := context.Background()
	m := start(t, e, "a1", `{"description":"CI","kv":"builds/ci.>"}`)
	for _, k := range []string{"a", "b", "c"} {
		if _, err := kv.PutString(ctx, "ci."+k, k); err != nil {
			t.Fatal(err)
		}
	}
	// What the dead replica stored: batch 0, up to revision 1.
	dead := monitors.EventEnvelope(m, &monitors.Batch{Seq: 0, Lines: []string{"ci.a PUT a"}, Cursor: "1"}, time.Now())
	if _, err := consumer.NewInbox(e.res.JS, engine.InboxStream, 2*time.Minute, nil).Deliver(ctx, &dead); err != nil {
		t.Fatal(err)
	}
	o := &owner{}
	o.all.Store(true)
	kvWatcher(t, e, o)
	want := []string{"ci.a PUT a", "ci.b PUT b", "ci.c PUT c"}
	testwait.Until(t, 10*time.Second, func() (bool, string) {
		got := kvLines(t, e, "a1")
		return strings.Join(got, "|") == strings.Join(want, "|"), fmt.Sprintf("lines %q", got)
	})
	rec, err := e.store.Get(ctx, "a1", m.ID)
	if err != nil || rec.Events != 3 || rec.NextSeq != 2 || rec.Cursor != "3" {
		t.Fatalf("record: %+v %v", rec, err)
	}
}
