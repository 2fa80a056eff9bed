package kvrec_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/testwait"
)

// job is a record that finishes.
type job struct {
	ID    string `json:"id"`
	Done  bool   `json:"done"`
	Steps int    `json:"steps"`
}

func (j *job) finished() bool { return j.Done }

// ttlBucket makes bucket "jobs" with per-message TTLs and 1 s markers,
// first without them when before is set (a bucket made by an older
// version), writing before into it.
func ttlBucket(t *testing.T, before func(jetstream.KeyValue)) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	js := startEngine(t).jetstream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if before != nil {
		old, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "jobs", History: 1})
		if err != nil {
			t.Fatal(err)
		}
		before(old)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "jobs", History: 1, LimitMarkerTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return js, kv
}

// ttlOf is the Nats-TTL header of key's last message ("" for none).
func ttlOf(t *testing.T, js jetstream.JetStream, key string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "KV_jobs")
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, "$KV.jobs."+key)
	if err != nil {
		t.Fatal(err)
	}
	return m.Header.Get(jetstream.MsgTTLHeader)
}

func gone(t *testing.T, kv jetstream.KeyValue, key string) bool {
	t.Helper()
	_, err := kv.Get(context.Background(), key)
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatal(err)
	}
	return err != nil
}

func readJob(t *testing.T, kv jetstream.KeyValue, key string) job {
	t.Helper()
	v, _, err := kvrec.Get[job](context.Background(), kv, key)
	if err != nil {
		t.Fatal(err)
	}
	return *v
}

func waitGone(t *testing.T, kv jetstream.KeyValue, key string) {
	t.Helper()
	testwait.Eventually(t, 10*time.Second, func() bool { return gone(t, kv, key) }, "%s still there", key)
}

// TestFinishedRecordsExpire: the write that finishes a record carries the
// retention as its TTL and the server removes it then; live records and
// their writes carry none; racing finishing writes are CAS conflicts
// retried as ever; the key can be created again once it is gone.
func TestFinishedRecordsExpire(t *testing.T) {
	js, kv := ttlBucket(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ret := kvrec.Retention{JS: js, After: time.Second, Markers: time.Second}
	expire := kvrec.ExpireFinished(ret, (*job).finished)
	step := func(key string, done bool) {
		t.Helper()
		if _, _, err := kvrec.Update(ctx, kv, key, true, func(j *job) (bool, error) {
			j.ID, j.Steps, j.Done = key, j.Steps+1, done
			return true, nil
		}, expire); err != nil {
			t.Fatal(err)
		}
	}
	step("live", false)
	step("live", false)
	step("ends", false)
	if ttl := ttlOf(t, js, "ends"); ttl != "" {
		t.Fatalf("a live record's write has TTL %q", ttl)
	}
	// Eight writers finish the record at once: each lands once, by CAS.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { step("ends", true) })
	}
	wg.Wait()
	if got := readJob(t, kv, "ends"); got.Steps != 9 {
		t.Fatalf("after 8 racing finishing writes: %+v", got)
	}
	if ttl := ttlOf(t, js, "ends"); ttl != "1s" {
		t.Fatalf("finishing write has TTL %q", ttl)
	}
	waitGone(t, kv, "ends")
	if _, _, err := kvrec.Update(ctx, kv, "ends", false, func(*job) (bool, error) { return true, nil }, expire); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("update of an expired record: %v", err)
	}
	again := &job{ID: "ends"}
	if _, _, err := kvrec.Create(ctx, kv, "ends", again, func(*job) bool { return false }); err != nil {
		t.Fatalf("create over the expired key's marker: %v", err)
	}
	if gone(t, kv, "live") || readJob(t, kv, "live").Steps != 2 {
		t.Fatal("the live record changed")
	}
	// Zero retention keeps finished records.
	if _, _, err := kvrec.Update(ctx, kv, "kept", true, func(j *job) (bool, error) { j.Done = true; return true, nil },
		kvrec.ExpireFinished(kvrec.Retention{}, (*job).finished)); err != nil {
		t.Fatal(err)
	}
	if ttl := ttlOf(t, js, "kept"); ttl != "" {
		t.Fatalf("zero retention wrote TTL %q", ttl)
	}
}

// TestSweep: what a bucket kept from before records expired gets a TTL
// once: a finished record older than the retention goes at once, a newer
// one when its retention ends, a deletion marker after the marker TTL;
// live records, values that are not records and what expires already are
// left alone; a second sweep finds nothing to do.
func TestSweep(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js, kv := ttlBucket(t, func(old jetstream.KeyValue) {
		for key, v := range map[string]string{
			"old":   `{"id":"old","done":true}`,
			"live":  `{"id":"live"}`,
			"other": `not a record`,
			"gone":  `{"id":"gone"}`,
		} {
			if _, err := old.Put(ctx, key, []byte(v)); err != nil {
				t.Fatal(err)
			}
		}
		if err := old.Delete(ctx, "gone"); err != nil {
			t.Fatal(err)
		}
	})
	if _, err := kv.Create(ctx, "expiring", []byte(`{"done":true}`), jetstream.KeyTTL(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "recent", []byte(`{"id":"recent","done":true}`)); err != nil {
		t.Fatal(err)
	}
	ret := kvrec.Retention{JS: js, After: time.Hour, Markers: time.Second}
	// "recent" was written now; "old" an hour and more before now (as the
	// sweep's clock says).
	later := time.Now().Add(time.Hour)
	old := func(j *job) bool { return j.finished() && j.ID != "recent" }
	if n, err := kvrec.Sweep(ctx, ret, kv, old, later); err != nil || n != 2 {
		t.Fatalf("sweep gave %d a TTL (%v), want old and the marker of gone", n, err)
	}
	if n, err := kvrec.Sweep(ctx, ret, kv, (*job).finished, time.Now()); err != nil || n != 1 {
		t.Fatalf("second sweep gave %d a TTL (%v), want only recent", n, err)
	}
	if ttl := ttlOf(t, js, "recent"); ttl != "1h0m0s" {
		t.Errorf("recent got TTL %q, about the whole retention", ttl)
	}
	if n, err := kvrec.Sweep(ctx, ret, kv, (*job).finished, later); err != nil || n != 0 {
		t.Fatalf("third sweep gave %d a TTL (%v)", n, err)
	}
	waitGone(t, kv, "old")
	for _, key := range []string{"live", "other", "expiring", "recent"} {
		if gone(t, kv, key) {
			t.Errorf("%s removed", key)
		}
	}
	s, err := js.Stream(ctx, "KV_jobs")
	if err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, func() bool {
		_, err := s.GetLastMsgForSubject(ctx, "$KV.jobs.gone")
		return errors.Is(err, jetstream.ErrMsgNotFound)
	}, "the deletion marker of gone removed")
	if n, err := kvrec.Sweep(ctx, kvrec.Retention{}, kv, (*job).finished, later); err != nil || n != 0 {
		t.Fatalf("zero retention swept %d (%v)", n, err)
	}
}

// Both codes of a refused expected revision are a revision mismatch; a
// replicated stream answers 10164 where a single server answers 10071.
func TestRevisionMismatchCodes(t *testing.T) {
	for _, code := range []jetstream.ErrorCode{jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant} {
		err := kvrec.RevisionMismatch(&jetstream.APIError{Code: 400, ErrorCode: code, Description: "wrong last sequence"})
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			t.Errorf("code %d: %v is not a revision mismatch", code, err)
		}
	}
	other := &jetstream.APIError{Code: 503, ErrorCode: 10008}
	if err := kvrec.RevisionMismatch(other); errors.Is(err, jetstream.ErrKeyRevisionMismatch) || err != error(other) {
		t.Errorf("another error became %v", err)
	}
}
