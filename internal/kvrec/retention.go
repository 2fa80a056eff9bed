package kvrec

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Retention says how long finished records stay in their bucket. Each
// write that leaves a record finished carries a per-message TTL
// (Nats-TTL, on a bucket with LimitMarkerTTL), so the server removes the
// key After that write and leaves a deletion marker that watches see and
// that itself expires after the bucket's marker TTL. The TTL belongs to a
// revision: a later write of a finished record carries the whole period
// again, a write that makes it live again carries none. The zero value
// keeps every record forever.
type Retention struct {
	// JS writes the expiring revisions: the KV API can put a TTL only on
	// a create, not on a CAS update. The stores that hold a Retention
	// also read their paged listings through it (ListPage).
	JS jetstream.JetStream
	// After is how long a finished record stays after its last write;
	// whole seconds, at least one (the engine's unit). Zero: forever.
	After time.Duration
	// Markers is the TTL of the deletion markers Purge writes (the
	// bucket's LimitMarkerTTL); zero leaves them for good.
	Markers time.Duration
}

// Option changes how Update and UpdateRev write.
type Option[T any] func(*options[T])

type options[T any] struct {
	ret      Retention
	finished func(*T) bool
	// cur and rev: the caller's copy of the record, for the first attempt.
	cur *T
	rev uint64
	// atLeast: a revision the record is known to have reached.
	atLeast uint64
}

// Current gives Update the record as the caller last read it (v at
// revision rev, e.g. from a KV watch): the first attempt decides from v and
// writes by CAS on rev without a read, saving a round trip when v is
// current; a stale v loses the CAS and the update reads as usual. v is
// changed in place.
func Current[T any](v *T, rev uint64) Option[T] {
	return func(o *options[T]) { o.cur, o.rev = v, rev }
}

// AtLeast tells UpdateRev that the record at key reached revision rev
// (e.g. a fire decided on it): an answer older than that, or with no
// record and no deletion after it, is stale and asked again rather than
// believed.
func AtLeast[T any](rev uint64) Option[T] {
	return func(o *options[T]) { o.atLeast = rev }
}

// ExpireFinished makes each write of a record that finished reports as
// finished expire after r.After (see Retention).
func ExpireFinished[T any](r Retention, finished func(*T) bool) Option[T] {
	return func(o *options[T]) { o.ret, o.finished = r, finished }
}

func newOptions[T any](opts []Option[T]) *options[T] {
	o := &options[T]{}
	for _, opt := range opts {
		opt(o)
	}
	return o
}

// ttl is the TTL a write of v carries; zero for none.
func (o *options[T]) ttl(v *T) time.Duration {
	if o.finished == nil || o.ret.After <= 0 || !o.finished(v) {
		return 0
	}
	return o.ret.After
}

// write stores data as the revision after rev (0: a new key) by CAS.
func (o *options[T]) write(ctx context.Context, kv jetstream.KeyValue, key string, data []byte, rev uint64, v *T) (uint64, error) {
	ttl := o.ttl(v)
	switch {
	case rev == 0 && ttl > 0:
		return kv.Create(ctx, key, data, jetstream.KeyTTL(ttl))
	case rev == 0:
		return kv.Create(ctx, key, data)
	case ttl > 0:
		return UpdateTTL(ctx, o.ret.JS, kv.Bucket(), key, data, rev, ttl)
	default:
		return kv.Update(ctx, key, data, rev)
	}
}

// UpdateTTL is kv.Update with a TTL: the message the KV client would
// publish (chime uses no JetStream domain or API prefix, so the subject is
// $KV.<bucket>.<key>) with the expected revision and Nats-TTL headers. A
// lost race is jetstream.ErrKeyRevisionMismatch, as from kv.Update.
func UpdateTTL(ctx context.Context, js jetstream.JetStream, bucket, key string, data []byte, rev uint64, ttl time.Duration) (uint64, error) {
	m := &nats.Msg{Subject: "$KV." + bucket + "." + key, Data: data}
	ack, err := js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(ttl))
	if err != nil {
		return 0, RevisionMismatch(err)
	}
	return ack.Sequence, nil
}

// RevisionMismatch marks a write refused for its expected revision (either
// code the server gives a conflict: 10071, or 10164 on replicated streams)
// as jetstream.ErrKeyRevisionMismatch, as the KV client's Update does;
// other errors are returned as they are.
func RevisionMismatch(err error) error {
	if e, ok := errors.AsType[*jetstream.APIError](err); ok &&
		(e.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || e.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return fmt.Errorf("%w: %w", err, jetstream.ErrKeyRevisionMismatch)
	}
	return err
}

// Purge removes key's record and leaves a deletion marker that expires
// after r.Markers, so the bucket does not keep one for every key it ever
// had.
func (r Retention) Purge(ctx context.Context, kv jetstream.KeyValue, key string) error {
	return r.PurgeRev(ctx, kv, key, 0)
}

// PurgeRev is Purge by CAS: only while key is at revision rev (0: any),
// else jetstream.ErrKeyRevisionMismatch.
func (r Retention) PurgeRev(ctx context.Context, kv jetstream.KeyValue, key string, rev uint64) error {
	var opts []jetstream.KVDeleteOpt
	if r.Markers > 0 {
		opts = append(opts, jetstream.PurgeTTL(r.Markers))
	}
	if rev > 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	return RevisionMismatch(kv.Purge(ctx, key, opts...))
}

// Headers of the KV stream's messages the sweep reads.
const (
	kvOperation  = "KV-Operation"
	markerReason = "Nats-Marker-Reason"
)

// Sweep gives a TTL to what a bucket holds without one from before
// records expired: each finished record (as finished says) gets what is
// left of r.After since its last write, at least a second, so one older
// than the retention goes at once and the others when they would have had
// they been written with a TTL; each deletion marker gets r.Markers. A
// record written meanwhile is left to that write. It reads the bucket's
// current values once, through its own consumer (a KV watch does not show
// headers, which say what already expires), and returns how many it gave
// a TTL. Every replica may run it at once: each change is a CAS.
func Sweep[T any](ctx context.Context, r Retention, kv jetstream.KeyValue, finished func(*T) bool, now time.Time) (int, error) {
	if r.After <= 0 {
		return 0, nil
	}
	stream, err := r.JS.Stream(ctx, "KV_"+kv.Bucket())
	if err != nil {
		return 0, fmt.Errorf("sweep %s: %w", kv.Bucket(), err)
	}
	prefix := "$KV." + kv.Bucket() + "."
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		AckPolicy: jetstream.AckNonePolicy, FilterSubject: prefix + ">", DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
		MemoryStorage: true, Replicas: 1, InactiveThreshold: time.Minute,
	})
	if err != nil {
		return 0, fmt.Errorf("sweep %s: %w", kv.Bucket(), err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), AttemptTimeout)
		defer cancel()
		_ = stream.DeleteConsumer(dctx, cons.CachedInfo().Name)
	}()
	if cons.CachedInfo().NumPending == 0 {
		return 0, nil
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(512))
	if err != nil {
		return 0, fmt.Errorf("sweep %s: %w", kv.Bucket(), err)
	}
	defer it.Stop()
	defer context.AfterFunc(ctx, it.Stop)()
	swept := 0
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return swept, fmt.Errorf("sweep %s: %w", kv.Bucket(), err)
		}
		md, err := m.Metadata()
		if err != nil {
			return swept, fmt.Errorf("sweep %s: %w", kv.Bucket(), err)
		}
		key := m.Subject()[len(prefix):]
		done, err := sweepOne(ctx, r, kv, key, m, md, finished, now)
		if err != nil {
			return swept, fmt.Errorf("sweep %s: %w", kv.Bucket(), err)
		}
		if done {
			swept++
		}
		if md.NumPending == 0 {
			return swept, nil
		}
	}
}

// sweepOne gives one current value a TTL if it needs one (see Sweep).
func sweepOne[T any](ctx context.Context, r Retention, kv jetstream.KeyValue, key string, m jetstream.Msg, md *jetstream.MsgMetadata, finished func(*T) bool, now time.Time) (bool, error) {
	h := m.Headers()
	if h.Get(jetstream.MsgTTLHeader) != "" || h.Get(markerReason) != "" {
		return false, nil // expires already
	}
	var err error
	switch op := h.Get(kvOperation); {
	case op == "DEL" || op == "PURGE":
		if r.Markers <= 0 {
			return false, nil
		}
		_, err = attempt(ctx, func(ctx context.Context) (struct{}, error) {
			return struct{}{}, kv.Purge(ctx, key, jetstream.LastRevision(md.Sequence.Stream), jetstream.PurgeTTL(r.Markers))
		})
	default:
		var v T
		if json.Unmarshal(m.Data(), &v) != nil || !finished(&v) {
			return false, nil // not a record of this bucket's, or live
		}
		// The engine counts TTLs in whole seconds: round up.
		ttl := max((r.After - now.Sub(md.Timestamp) + time.Second - 1).Truncate(time.Second), time.Second)
		_, err = attempt(ctx, func(ctx context.Context) (uint64, error) {
			return UpdateTTL(ctx, r.JS, kv.Bucket(), key, m.Data(), md.Sequence.Stream, ttl)
		})
	}
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return false, nil // written meanwhile: that write decides
	}
	return err == nil, err
}
