package kvrec

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/internal/directget"
)

// History is where a kind's finished records spend their retention once
// they have left their live bucket: a stream with no per-message TTL (its
// MaxAge is the retention) whose subjects are <Prefix>.<agent>.<x>, x one
// hex digit hashed from the record's ID. The server's subject index then
// holds at most historySubjects entries per agent, not one per record as a
// KV key costs, and a get by ID reads only that digit's subject: about a
// sixteenth of the agent's finished records. The zero History keeps
// finished records in their bucket, as before.
type History struct {
	// JS reads and writes the stream.
	JS jetstream.JetStream
	// Stream is the history stream's name.
	Stream string
	// Prefix is the kind's subject prefix, e.g. "history.timer".
	Prefix string
}

// historySubjects is how many subjects one agent's history of a kind is
// spread over (one hex digit).
const historySubjects = 16

// On reports whether finished records go to the history stream.
func (h History) On() bool { return h.JS != nil && h.Stream != "" && h.Prefix != "" }

// Subject is the subject that record id of agentID is kept on.
func (h History) Subject(agentID, id string) string {
	f := fnv.New32a()
	_, _ = f.Write([]byte(id))
	return h.Prefix + "." + agentID + "." + string("0123456789abcdef"[f.Sum32()%historySubjects])
}

// Filter is the subject filter of every record of agentID.
func (h History) Filter(agentID string) string { return h.Prefix + "." + agentID + ".*" }

// put stores a finished record's bytes in the history.
func (h History) put(ctx context.Context, agentID, id string, data []byte) error {
	_, err := Retried(ctx, func(ctx context.Context) (*jetstream.PubAck, error) {
		return h.JS.PublishMsg(ctx, &nats.Msg{Subject: h.Subject(agentID, id), Data: data})
	})
	return err
}

// historyBatch is how many messages one direct get of a history scan asks
// for.
const historyBatch = 256

// HistoryGet finds record id of agentID in h: the last one written, as a
// record written twice (an archive retried after a crash) may be. Not
// there is jetstream.ErrKeyNotFound. idOf names a decoded record's ID.
//
// Direct gets are answered by any copy of the stream, and a server back
// from a partition answers from its copy while it catches up: a record
// archived meanwhile is missing there. A miss is therefore checked with
// the stream's leader (with every server that believes it leads, see
// leadersLast): when the leader holds a later message on the record's
// subject than the read reached, the read came from a lagging copy and is
// made again (a wait fire redelivered after its wait was
// archived would otherwise find no wait, and be acknowledged with its
// ending never delivered).
func HistoryGet[T any](ctx context.Context, h History, agentID, id string, idOf func(*T) string) (*T, error) {
	if !h.On() {
		return nil, jetstream.ErrKeyNotFound
	}
	filter := h.Subject(agentID, id)
	quoted, err := json.Marshal(id)
	if err != nil {
		return nil, fmt.Errorf("history %s: %w", filter, err)
	}
	p := &pacer{}
	var mark leaderMark
	for {
		found, reached, err := historyFind(ctx, h, filter, quoted, id, idOf)
		if err != nil || found != nil {
			return found, err
		}
		err = mark.behind(ctx, reached, func(ctx context.Context) (uint64, error) {
			return leadersLast(ctx, h.JS.Conn(), filter)
		})
		if err == nil {
			return nil, jetstream.ErrKeyNotFound
		}
		if again, err := p.retry(ctx, err); !again {
			return nil, fmt.Errorf("history %s: %w", filter, err)
		}
	}
}

// historyFind is one read of HistoryGet: the record if found, and the last
// sequence read on the record's subject.
func historyFind[T any](ctx context.Context, h History, filter string, quoted []byte, id string, idOf func(*T) string) (*T, uint64, error) {
	var found []byte
	var reached uint64
	err := h.reader().Walk(ctx, directget.Request{NextFor: filter, Batch: historyBatch}, func(m *directget.Msg) error {
		reached = max(reached, m.Seq)
		// A cheap look before decoding: most are other records.
		if bytes.Contains(m.Data, quoted) {
			if v, err := decode[T](m.Subject, m.Data); err == nil && idOf(v) == id {
				found = m.Data
			}
		}
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("history %s: %w", filter, err)
	}
	if found == nil {
		return nil, reached, nil
	}
	v, err := decode[T](filter, found)
	return v, reached, err
}

// reader reads h's stream by direct gets, retried as every read is.
func (h History) reader() *directget.Stream {
	return directget.New(h.JS, h.Stream, directget.WithRetry(Retried[*directget.Answer]))
}

// HistoryPage reads one page of agentID's records in h from seq (0: the
// start), in stream order (the order they finished), at most limit, with
// where the next page starts (0: nothing is left).
func HistoryPage[T any](ctx context.Context, h History, agentID string, seq uint64, limit int) ([]T, uint64, error) {
	if !h.On() || limit <= 0 {
		return nil, 0, nil
	}
	a, err := h.reader().Get(ctx, directget.Request{Seq: max(seq, 1), NextFor: h.Filter(agentID), Batch: limit})
	if err != nil {
		return nil, 0, fmt.Errorf("history %s: %w", h.Filter(agentID), err)
	}
	out := make([]T, 0, len(a.Msgs))
	next := uint64(0)
	for i := range a.Msgs {
		m := &a.Msgs[i]
		v, err := decode[T](m.Subject, m.Data)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, *v)
		next = m.Seq + 1
	}
	if a.Pending == 0 {
		next = 0
	}
	return out, next, nil
}

// An Archiver moves finished records from their live bucket to their
// history, in the background: it stores the record in the history stream,
// then purges its key by CAS on the finishing revision, leaving a marker
// that expires after the bucket's marker TTL (Retention.Markers). A watch
// sees that removal as a deletion of a record that had already finished,
// which changes nothing; one behind sees it instead of the finishing
// write, with the same effect (the record is no longer live). Whatever is
// not archived (the queue full, the process stopped, a failure) stays in
// its bucket with its per-message TTL and expires as before, so an archive
// is only ever a saving, never a loss.
type Archiver struct {
	ret   Retention
	log   *slog.Logger
	queue chan archiveJob
	wg    sync.WaitGroup
	stop  context.CancelFunc

	archived, skipped prometheus.Counter
}

type archiveJob struct {
	h           History
	kv          jetstream.KeyValue
	key         string
	rev         uint64
	agentID, id string
	data        []byte
}

// archiveQueue bounds the records waiting to be archived: a burst beyond
// it stays in its bucket and expires there.
const archiveQueue = 16384

// archiveWorkers is how many records are archived at once (two round trips
// each).
const archiveWorkers = 8

// NewArchiver returns an Archiver purging through r; Start runs it.
func NewArchiver(r Retention, log *slog.Logger) *Archiver {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Archiver{
		ret: r, log: log.With("component", "history"), queue: make(chan archiveJob, archiveQueue),
		archived: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_history_archived_total", Help: "Finished records moved from their bucket to the history stream.",
		}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_history_skipped_total", Help: "Finished records left in their bucket to expire there (archive queue full or failed).",
		}),
	}
}

// Register registers the archiver's metrics with reg.
func (a *Archiver) Register(reg prometheus.Registerer) {
	if a != nil && reg != nil {
		reg.MustRegister(a.archived, a.skipped)
	}
}

// Start runs the archiver until ctx ends or Stop.
func (a *Archiver) Start(ctx context.Context) error {
	ctx, a.stop = context.WithCancel(ctx)
	for range archiveWorkers {
		a.wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case j := <-a.queue:
					a.archive(ctx, j)
				}
			}
		})
	}
	return nil
}

// Stop stops the archiver and waits for its workers. What is still queued
// stays in its bucket and expires there. Idempotent and safe without
// Start.
func (a *Archiver) Stop(context.Context) error {
	if a != nil && a.stop != nil {
		a.stop()
		a.wg.Wait()
	}
	return nil
}

// archiveTimeout bounds one record's archive, retries included.
const archiveTimeout = 30 * time.Second

func (a *Archiver) archive(ctx context.Context, j archiveJob) {
	ctx, cancel := context.WithTimeout(ctx, archiveTimeout)
	defer cancel()
	if err := j.h.put(ctx, j.agentID, j.id, j.data); err != nil {
		a.skipped.Inc()
		a.log.Warn("finished record left in its bucket: not stored in the history", "key", j.key, "err", err)
		return
	}
	err := a.ret.PurgeRev(ctx, j.kv, j.key, j.rev)
	if err != nil && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !errors.Is(err, jetstream.ErrKeyNotFound) {
		// It stays in both for its retention: a get finds it in its
		// bucket first, and a list leaves out the history's copy
		// (PageWithHistory).
		a.skipped.Inc()
		a.log.Warn("finished record left in its bucket: purge failed", "key", j.key, "err", err)
		return
	}
	a.archived.Inc()
}

// Archive queues the record at key, written finished at revision rev as
// data, for its history h; it never blocks (see Archiver). A nil Archiver
// or an h that is off archives nothing.
func (a *Archiver) Archive(h History, kv jetstream.KeyValue, key string, rev uint64, agentID, id string, data []byte) {
	if a == nil || !h.On() {
		return
	}
	select {
	case a.queue <- archiveJob{h: h, kv: kv, key: key, rev: rev, agentID: agentID, id: id, data: data}:
	default:
		a.skipped.Inc()
	}
}

// PageWithHistory is ListPage over buckets (filter, no keep) followed by
// agentID's records in h, as one walk: its positions count h as one more
// bucket after the others, so a position of a walk without the history is
// refused (ErrPos). With h off it is ListPage. liveKey names a record's
// bucket and key: a record of the history whose key still holds it in its
// bucket (moved, not purged yet: an instant, or for its retention when the
// purge failed) is left out, as it comes from the bucket.
func PageWithHistory[T any](ctx context.Context, js jetstream.JetStream, buckets []string, filter string, h History, agentID string, from Pos, limit int, liveKey func(*T) (bucket, key string)) (Page[T], error) {
	if !h.On() {
		return ListPage[T](ctx, js, buckets, filter, from, limit, nil)
	}
	n := len(buckets)
	var pg Page[T]
	hseq := uint64(0)
	switch {
	case from == Pos{} || from.Buckets == n+1 && from.Bucket >= 0 && from.Bucket < n:
		live := from
		if live != (Pos{}) {
			live.Buckets = n
		}
		var err error
		if pg, err = ListPage[T](ctx, js, buckets, filter, live, limit, nil); err != nil {
			return pg, err
		}
		if !pg.Next.End() {
			pg.Next.Buckets = n + 1
			return pg, nil
		}
	case from.Buckets == n+1 && from.Bucket == n:
		pg.Items, hseq = []T{}, from.Seq
	case from.Buckets == n+1 && from.Bucket == n+1:
		return Page[T]{Items: []T{}, Next: from}, nil
	default:
		return pg, fmt.Errorf("%w: bucket %d of %d, this walk has %d", ErrPos, from.Bucket, from.Buckets, n+1)
	}
	end := Pos{Buckets: n + 1, Bucket: n + 1}
	want := limit - len(pg.Items)
	if want <= 0 {
		// Full at the buckets' end: probe the history, so that a walk
		// with nothing left says so now rather than with an empty page.
		probe, _, err := HistoryPage[T](ctx, h, agentID, hseq, 1)
		pg.Requests++
		if err != nil {
			return Page[T]{}, err
		}
		if len(probe) == 0 {
			pg.Next = end
		} else {
			pg.Next = Pos{Buckets: n + 1, Bucket: n, Seq: hseq}
		}
		return pg, nil
	}
	items, next, err := HistoryPage[T](ctx, h, agentID, hseq, want)
	pg.Requests++
	if err != nil {
		return Page[T]{}, err
	}
	pg.Read += len(items)
	items, asked, err := notInBucket(ctx, js, items, liveKey)
	pg.Requests += asked
	if err != nil {
		return Page[T]{}, err
	}
	pg.Items = append(pg.Items, inPageOnce(pg.Items, items, liveKey)...)
	if next == 0 {
		pg.Next = end
	} else {
		pg.Next = Pos{Buckets: n + 1, Bucket: n, Seq: next}
	}
	return pg, nil
}

// inPageOnce leaves out of items, read from the history, those the page
// already holds from their bucket: a record moved between the page's read
// of its bucket and its read of the history is in both reads, and its key
// is gone from the bucket by the time notInBucket looks.
func inPageOnce[T any](page, items []T, liveKey func(*T) (string, string)) []T {
	if liveKey == nil || len(page) == 0 {
		return items
	}
	type place struct{ bucket, key string }
	seen := make(map[place]bool, len(page))
	for i := range page {
		b, k := liveKey(&page[i])
		seen[place{b, k}] = true
	}
	return slices.DeleteFunc(items, func(v T) bool {
		b, k := liveKey(&v)
		return seen[place{b, k}]
	})
}

// notInBucket leaves out of items, records read from the history, those
// whose key still holds a record in its bucket, in one multi-last direct
// get per bucket (and 1024 keys); it returns how many it asked.
func notInBucket[T any](ctx context.Context, js jetstream.JetStream, items []T, liveKey func(*T) (string, string)) ([]T, int, error) {
	if liveKey == nil || len(items) == 0 {
		return items, 0, nil
	}
	subject := func(v *T) string {
		bucket, key := liveKey(v)
		return "$KV." + bucket + "." + key
	}
	byBucket := map[string][]string{}
	for i := range items {
		bucket, _ := liveKey(&items[i])
		byBucket[bucket] = append(byBucket[bucket], subject(&items[i]))
	}
	live, asked := map[string]bool{}, 0
	for bucket, subjects := range byBucket {
		st := directget.New(js, "KV_"+bucket, directget.WithRetry(Retried[*directget.Answer]))
		for chunk := range slices.Chunk(subjects, directget.MaxMultiLast) {
			asked++
			a, err := st.Get(ctx, directget.Request{MultiLast: chunk, Batch: len(chunk)})
			if err != nil {
				return nil, asked, fmt.Errorf("history: which records are still in %s: %w", bucket, err)
			}
			for i := range a.Msgs {
				if !a.Msgs[i].Deleted() {
					live[a.Msgs[i].Subject] = true
				}
			}
		}
	}
	out := make([]T, 0, len(items))
	for i := range items {
		if !live[subject(&items[i])] {
			out = append(out, items[i])
		}
	}
	return out, asked, nil
}
