package kvrec_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/kvrec"
)

// partitions makes n buckets p0..p(n-1) as chime makes its record buckets
// (one revision per key, markers for expired records), returning them
// with their names.
func partitions(t *testing.T, js jetstream.JetStream, n int) ([]jetstream.KeyValue, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var kvs []jetstream.KeyValue
	var names []string
	for i := range n {
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: fmt.Sprintf("p%d", i), History: 1, LimitMarkerTTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		kvs = append(kvs, kv)
		names = append(names, kv.Bucket())
	}
	return kvs, names
}

// walk pages through agent's records from the start, doing between(page
// number) after each page but the last, and returns the pages.
func walk(t *testing.T, js jetstream.JetStream, buckets []string, agent string, limit int, keep func(*rec) bool, between func(int)) []kvrec.Page[rec] {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var pages []kvrec.Page[rec]
	var pos kvrec.Pos
	for {
		pg, err := kvrec.ListPage(ctx, js, buckets, agent+".*", pos, limit, keep)
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, pg)
		if pg.Next.End() {
			return pages
		}
		if len(pages) > 10_000 {
			t.Fatal("the walk does not end")
		}
		pos = pg.Next
		if between != nil {
			between(len(pages))
		}
	}
}

func ids(pages []kvrec.Page[rec]) []string {
	var out []string
	for _, pg := range pages {
		for _, r := range pg.Items {
			out = append(out, r.ID)
		}
	}
	return out
}

// TestListPageWalksBuckets pages through one agent's records spread over
// three buckets among another agent's, with deleted and purged keys: every
// record once, bucket after bucket in write order, each page reading only
// what it returns, and the last page known to be last.
func TestListPageWalksBuckets(t *testing.T) {
	js := startEngine(t).jetstream(t)
	kvs, names := partitions(t, js, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var want []string
	for b, kv := range kvs {
		for i := range 7 {
			id := fmt.Sprintf("r%d_%d", b, i)
			put(t, kv, "a."+id, rec{ID: id})
			want = append(want, id)
			for j := range 5 {
				put(t, kv, fmt.Sprintf("b.%d_%d_%d", b, i, j), rec{ID: "other"})
			}
		}
	}
	// Gone: deleted, purged, and a key rewritten, which moves to the end.
	if err := kvs[0].Delete(ctx, "a.r0_1"); err != nil {
		t.Fatal(err)
	}
	if err := kvs[1].Purge(ctx, "a.r1_6"); err != nil {
		t.Fatal(err)
	}
	put(t, kvs[0], "a.r0_0", rec{ID: "r0_0", Changes: 1})
	want = slices.DeleteFunc(want, func(id string) bool { return id == "r0_1" || id == "r1_6" || id == "r0_0" })
	want = slices.Insert(want, 5, "r0_0") // after r0_2..r0_6

	for _, limit := range []int{1, 4, 7, 100} {
		pages := walk(t, js, names, "a", limit, nil, nil)
		if got := ids(pages); !slices.Equal(got, want) {
			t.Fatalf("limit %d: %v, want %v", limit, got, want)
		}
		if n := (len(want) + limit - 1) / limit; len(pages) != n {
			t.Errorf("limit %d: %d pages, want %d (the last page must say it is the last)", limit, len(pages), n)
		}
		for i, pg := range pages {
			// Two markers are in the way once; a page reads no further
			// than it returns otherwise, and asks once per bucket it
			// reads plus one probe per bucket it ends before.
			if pg.Read > len(pg.Items)+2 || pg.Requests > 3+3 {
				t.Errorf("limit %d page %d: %d read, %d requests for %d records", limit, i, pg.Read, pg.Requests, len(pg.Items))
			}
		}
	}
	if pages := walk(t, js, names, "nobody", 10, nil, nil); len(pages) != 1 || len(pages[0].Items) != 0 || pages[0].Requests != 3 {
		t.Fatalf("no records: %d pages, %+v", len(pages), pages[0])
	}
}

// TestListPageWhileWritten creates, rewrites and deletes records between
// the pages of a walk: every record there throughout comes at least once,
// exactly once unless rewritten after its page, and then again as
// rewritten; created ones come; nothing else does.
func TestListPageWhileWritten(t *testing.T) {
	js := startEngine(t).jetstream(t)
	kvs, names := partitions(t, js, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for b, kv := range kvs {
		for i := range 20 {
			put(t, kv, fmt.Sprintf("a.s%d_%02d", b, i), rec{ID: fmt.Sprintf("s%d_%02d", b, i)})
		}
	}
	rewritten := map[string]bool{}
	deleted := map[string]bool{}
	var created []string
	pages := walk(t, js, names, "a", 6, nil, func(n int) {
		// Rewrite one record already listed and one not yet, delete one
		// not yet listed, and create one in each bucket, in turn.
		if n > 8 {
			return
		}
		b := n % 2
		done := fmt.Sprintf("s0_%02d", n-1) // listed by the first pages
		later := fmt.Sprintf("s1_%02d", 19-n)
		gone := fmt.Sprintf("s1_%02d", n)
		put(t, kvs[0], "a."+done, rec{ID: done, Changes: n})
		rewritten[done] = true
		if !deleted[later] {
			put(t, kvs[1], "a."+later, rec{ID: later, Changes: n})
			rewritten[later] = true
		}
		if !rewritten[gone] {
			if err := kvs[1].Delete(ctx, "a."+gone); err != nil {
				t.Fatal(err)
			}
			deleted[gone] = true
		}
		id := fmt.Sprintf("new%d_%d", b, n)
		put(t, kvs[b], "a."+id, rec{ID: id})
		created = append(created, id)
	})
	count := map[string]int{}
	for _, pg := range pages {
		for _, r := range pg.Items {
			count[r.ID]++
		}
	}
	for b := range 2 {
		for i := range 20 {
			id := fmt.Sprintf("s%d_%02d", b, i)
			switch {
			case deleted[id]:
				if count[id] > 1 {
					t.Errorf("%s (deleted) came %d times", id, count[id])
				}
			case rewritten[id]:
				if count[id] < 1 || count[id] > 2 {
					t.Errorf("%s (rewritten) came %d times", id, count[id])
				}
			case count[id] != 1:
				t.Errorf("%s came %d times, want once", id, count[id])
			}
		}
	}
	// Records created in bucket 1 come (the walk is still before its end);
	// those created in bucket 0 after the walk left it do not.
	for _, id := range created {
		if id[3] == '1' && count[id] != 1 {
			t.Errorf("%s, created in a bucket not walked yet, came %d times", id, count[id])
		}
	}
	if len(count) < 40-len(deleted) {
		t.Errorf("%d records listed", len(count))
	}
}

// TestListPageFilter keeps few of many records: no page reads more than
// MaxScan records, and the walk still finds every kept one.
func TestListPageFilter(t *testing.T) {
	js := startEngine(t).jetstream(t)
	_, names := partitions(t, js, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const total = 2500
	for i := range total {
		id := fmt.Sprintf("r%04d", i)
		r := rec{ID: id}
		if i%500 == 7 {
			r.Changes = 1 // kept
		}
		data := fmt.Appendf(nil, `{"id":%q,"changes":%d}`, r.ID, r.Changes)
		if _, err := js.PublishAsync("$KV."+names[0]+".a."+id, data); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("records not stored")
	}
	kept := func(r *rec) bool { return r.Changes == 1 }
	pages := walk(t, js, names, "a", 10, kept, nil)
	if got := ids(pages); len(got) != total/500 {
		t.Fatalf("kept %v", got)
	}
	read := 0
	for i, pg := range pages {
		if pg.Read > kvrec.MaxScan {
			t.Errorf("page %d read %d records", i, pg.Read)
		}
		read += pg.Read
	}
	if read != total {
		t.Errorf("the walk read %d records of %d", read, total)
	}
	if len(pages) != (total+kvrec.MaxScan-1)/kvrec.MaxScan {
		t.Errorf("%d pages", len(pages))
	}

	// Unfiltered, in small pages: more keys than a multi-last get
	// answers, so read by scanning, one get at a time; each once, in order.
	small := walk(t, js, names, "a", 7, nil, nil)
	if !small[0].Next.Scan || small[1].Requests != 7 {
		t.Errorf("second page of 7: %+v, want a scan of 7 gets", small[1])
	}
	got := ids(small)
	if len(got) != total {
		t.Fatalf("%d records listed in pages of 7, want %d", len(got), total)
	}
	for i, id := range got {
		if id != fmt.Sprintf("r%04d", i) {
			t.Fatalf("record %d is %s", i, id)
		}
	}
}

// TestListPageMarkers lists past the markers expired records leave.
func TestListPageMarkers(t *testing.T) {
	js := startEngine(t).jetstream(t)
	kvs, names := partitions(t, js, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	put(t, kvs[0], "a.live", rec{ID: "live"})
	m := nats.NewMsg("$KV." + names[0] + ".a.gone")
	m.Data = []byte(`{"id":"gone"}`)
	m.Header.Set(jetstream.MsgTTLHeader, "1s")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := kvs[0].Get(ctx, "a.gone"); errors.Is(err, jetstream.ErrKeyNotFound) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the record did not expire")
		case <-time.After(50 * time.Millisecond):
		}
	}
	if got := ids(walk(t, js, names, "a", 10, nil, nil)); !slices.Equal(got, []string{"live"}) {
		t.Fatalf("listed %v", got)
	}
}

// TestListPageRefuses positions of another walk and bad limits.
func TestListPageRefuses(t *testing.T) {
	js := startEngine(t).jetstream(t)
	_, names := partitions(t, js, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, pos := range []kvrec.Pos{{Buckets: 3, Bucket: 1, Seq: 5}, {Buckets: 2, Bucket: 3, Seq: 1}, {Buckets: 2, Bucket: -1}, {Bucket: 1}} {
		if _, err := kvrec.ListPage[rec](ctx, js, names, "a.*", pos, 10, nil); !errors.Is(err, kvrec.ErrPos) {
			t.Errorf("%+v: %v", pos, err)
		}
	}
	if _, err := kvrec.ListPage[rec](ctx, js, names, "a.*", kvrec.Pos{}, 0, nil); err == nil {
		t.Error("limit 0 accepted")
	}
	if pg, err := kvrec.ListPage[rec](ctx, js, names, "a.*", kvrec.Pos{Buckets: 2, Bucket: 2}, 10, nil); err != nil || !pg.Next.End() || len(pg.Items) != 0 {
		t.Errorf("from the end: %+v %v", pg, err)
	}
}
