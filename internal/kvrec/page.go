package kvrec

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/directget"
)

// MaxScan bounds the records one page reads when its filter leaves some
// out (or deletion markers are in the way): the page then ends short, with
// a position to go on from, rather than read on until it is full. So no
// page costs more than MaxScan records, whatever the agent keeps.
const MaxScan = 1000

// Pos is a paged walk's place: the index of the bucket in the walk's
// ordered list and the stream sequence in it to read from next. Buckets is
// the length of that list, so that a position from a walk over another
// list is refused instead of misread. Scan says the bucket holds more of
// the walk's keys than a multi-last get answers, so it is read by a
// filtered scan (see batch). The zero Pos is the start of any walk.
type Pos struct {
	Buckets int
	Bucket  int
	Seq     uint64
	Scan    bool
}

// End reports whether p is past the walk's last bucket: nothing is left.
func (p Pos) End() bool { return p.Buckets > 0 && p.Bucket >= p.Buckets }

// ErrPos means a position given to ListPage is not one of that walk.
var ErrPos = errors.New("not a position of this walk")

// Page is one page of a walk.
type Page[T any] struct {
	// Items are the page's records, in the walk's order.
	Items []T
	// Next is where the next page starts; Next.End() when nothing is left.
	Next Pos
	// Read is how many stream messages the page read, and Requests in how
	// many requests: what the page cost.
	Read, Requests int
}

// ListPage reads one page of the records whose keys match filter (a key
// pattern such as "agent.*") in buckets, walked one after another, each in
// stream order (the order of each record's last write), from from. It
// reads what it returns, in JetStream direct gets answered by any replica
// of the bucket's stream: at most limit records (or MaxScan, see there)
// and one small probe per bucket the page ends before. See batch for what
// the server does to find them.
//
// keep, when set, is a filter: a page holds at most limit records it
// keeps, and may hold fewer, even none, when MaxScan records were read
// first; Next then goes on after the last one read.
//
// A walk over buckets with one revision per key (history 1) returns every
// record that is there from its first page to its last at least once, and
// exactly once if it is not written meanwhile: a record written after its
// page comes again later, as it is then; one written before its page comes
// once, as written. A record created during the walk comes if the walk has
// not passed its bucket's end; one deleted may or may not come.
func ListPage[T any](ctx context.Context, js jetstream.JetStream, buckets []string, filter string, from Pos, limit int, keep func(*T) bool) (Page[T], error) {
	n := len(buckets)
	pg := Page[T]{Items: []T{}}
	switch {
	case js == nil:
		return pg, errors.New("list: no JetStream to read from")
	case limit <= 0:
		return pg, fmt.Errorf("list: limit %d is not positive", limit)
	case from == Pos{}:
		from.Buckets = n
	case from.Buckets != n || from.Bucket < 0 || from.Bucket > n:
		return pg, fmt.Errorf("%w: bucket %d of %d, this walk has %d", ErrPos, from.Bucket, from.Buckets, n)
	}
	budget := max(limit, MaxScan)
	pos := from
	full := func() bool { return len(pg.Items) >= limit || pg.Read >= budget }
	// take reads b into the page until the page is full, moving pos past
	// what it read; it reports whether it read all of b.
	take := func(b *batchResult) (bool, error) {
		for i := range b.msgs {
			m := &b.msgs[i]
			if full() {
				return false, nil // read again by the next page
			}
			pg.Read++
			pos.Seq = m.Seq + 1
			if m.Deleted() {
				continue
			}
			v, err := decode[T](b.key(m), m.Data)
			if err != nil {
				return false, err
			}
			if keep == nil || keep(v) {
				pg.Items = append(pg.Items, *v)
			}
		}
		return true, nil
	}
	for pos.Bucket < n && !full() {
		var b *batchResult
		var err error
		if pos.Seq == 0 {
			b, err = first(ctx, js, buckets[pos.Bucket], filter)
		} else {
			// Ask for what the page still lacks; after skipped records,
			// for more at a time (bounded by the budget) so that a
			// filter that keeps few does not cost a request per record.
			want := limit - len(pg.Items)
			if pg.Read > len(pg.Items) {
				want = max(want, 64)
			}
			want = min(want, budget-pg.Read)
			if pos.Scan && want <= maxSingles {
				want = 0 // one at a time: see maxSingles
			}
			b, err = batch(ctx, js, buckets[pos.Bucket], filter, pos.Seq, want, pos.Scan)
		}
		pg.Requests++
		if err != nil {
			return Page[T]{}, err
		}
		pos.Scan = b.scan
		all, err := take(b)
		if err != nil {
			return Page[T]{}, err
		}
		if all && b.pending == 0 {
			pos = Pos{Buckets: n, Bucket: pos.Bucket + 1}
		}
	}
	// The page ended at the start of a bucket: probe that one and the
	// ones after for a record, so that a walk with nothing left says so now
	// rather than with one more, empty page.
	for pos.Bucket < n && pos.Seq == 0 {
		b, err := first(ctx, js, buckets[pos.Bucket], filter)
		pg.Requests++
		if err != nil {
			return Page[T]{}, err
		}
		if len(b.msgs) > 0 {
			pos.Seq, pos.Scan = b.msgs[0].Seq, b.scan
			break
		}
		pos = Pos{Buckets: n, Bucket: pos.Bucket + 1}
	}
	pg.Next = pos
	return pg, nil
}

// maxSingles is how many records a scan reads one direct get at a time
// rather than in a batch. The server answers a batch with the count of
// what remains, which it makes by walking the bucket's index for every key
// of the filter and the stream block it starts in: about 4 ms for an agent
// with 20,000 keys, against some 40 µs for a get of one record.
const maxSingles = 32

// first reads the first record of bucket whose key matches filter, and
// how many more there are, which says how to read the rest (scan: more
// than a multi-last get answers). From the stream's start the server
// finds it, and counts, in its index of subjects.
func first(ctx context.Context, js jetstream.JetStream, bucket, filter string) (*batchResult, error) {
	b, err := batch(ctx, js, bucket, filter, 1, 1, true)
	if err != nil {
		return nil, err
	}
	b.scan = b.pending+1 > directget.MaxMultiLast
	return b, nil
}

// batchResult is what one direct get batch returned.
type batchResult struct {
	msgs []directget.Msg
	// pending is how many messages matching the filter the stream holds
	// after the last one returned (the end-of-batch count).
	pending uint64
	// scan says the batch was read by a filtered scan.
	scan bool
	// prefix is the length of the bucket's subject prefix, "$KV.<bucket>.".
	prefix int
}

// key is the key of m, a message of b.
func (b *batchResult) key(m *directget.Msg) string { return m.Subject[b.prefix:] }

// batch reads up to n messages of bucket whose keys match filter, from
// stream sequence seq on, in one direct get; n == 0 reads one, in a get
// that is no batch and has no pending count (pending is then 1 when it
// found one: maybe more). Retried as every call is (see retried).
//
// Unless scan is set it asks for the last message of each matching key
// from seq on ({"multi_last", "seq", "batch"}): the server finds them in
// its index of subjects, a cost that grows with the keys matching (at most
// 1024), not with the stream. For more keys than that the server refuses,
// and batch scans instead ({"seq", "next_by_subj", "batch"}), setting scan
// in its answer: the server then walks the stream from seq to each match,
// a cost that grows with the other keys' messages between them.
func batch(ctx context.Context, js jetstream.JetStream, bucket, filter string, seq uint64, n int, scan bool) (*batchResult, error) {
	st := directget.New(js, "KV_"+bucket, directget.WithRetry(Retried[*directget.Answer]))
	full := "$KV." + bucket + "." + filter
	ask := func(scan bool) (*directget.Answer, error) {
		if scan {
			return st.Get(ctx, directget.Request{Seq: seq, NextFor: full, Batch: n})
		}
		return st.Get(ctx, directget.Request{Seq: seq, MultiLast: []string{full}, Batch: n})
	}
	a, err := ask(scan)
	if errors.Is(err, directget.ErrTooMany) {
		a, err = ask(true)
		scan = true
	}
	if err != nil {
		return nil, fmt.Errorf("list %s in %s: %w", filter, bucket, err)
	}
	prefix := len("$KV.") + len(bucket) + 1
	res := &batchResult{msgs: a.Msgs, pending: a.Pending, scan: scan, prefix: prefix}
	for _, m := range res.msgs {
		if len(m.Subject) <= prefix {
			return nil, fmt.Errorf("list %s in %s: a message of subject %q, no key", filter, bucket, m.Subject)
		}
	}
	if n == 0 && len(res.msgs) > 0 {
		res.pending = 1 // maybe more
	}
	return res, nil
}

// Values reads the value of every key of bucket matching filter, removed
// ones left out, in as few direct gets as the keys allow: one up to 1024
// keys (a multi-last get), a scan beyond.
func Values(ctx context.Context, js jetstream.JetStream, bucket, filter string) (map[string][]byte, error) {
	out := map[string][]byte{}
	seq, scan := uint64(1), false
	for {
		b, err := batch(ctx, js, bucket, filter, seq, directget.MaxMultiLast, scan)
		if err != nil {
			return nil, err
		}
		for i := range b.msgs {
			m := &b.msgs[i]
			seq = m.Seq + 1
			if m.Deleted() {
				delete(out, b.key(m))
			} else {
				out[b.key(m)] = m.Data
			}
		}
		if b.pending == 0 || len(b.msgs) == 0 {
			return out, nil
		}
		scan = b.scan
	}
}
