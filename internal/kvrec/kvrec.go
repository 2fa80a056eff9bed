// Package kvrec owns how chime reads and writes JSON records in JetStream
// KV buckets: the one read-modify-write loop (read, decide, write by CAS on
// the revision, decide again when another writer got there first), the
// listing of every record under a key filter, and the paged listing that
// reads only the records it returns, over one bucket or several
// (ListPage).
//
// Leader elections are waits, not errors: every call retries transient
// engine errors (see Transient) with a short per-attempt timeout and a
// jittered backoff until its context ends, and then returns ErrUnavailable.
package kvrec

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/storefull"
)

// casAttempts bounds the writes of an update that keeps losing the race to
// other writers. Transient failures do not count: the deadline bounds those.
const casAttempts = 16

// confirm reads key's last message from the leader, to check a read that
// may have been stale: its data, nil when the leader holds no record (a
// deletion marker, or no message at all), and its revision (the marker's;
// 0 when there is no message).
func confirm(ctx context.Context, leader leaderGetter, key string) ([]byte, uint64, error) {
	type read struct {
		data []byte
		rev  uint64
	}
	r, err := Retried(ctx, func(ctx context.Context) (read, error) {
		data, rev, err := leader.leaderGet(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return read{}, nil
		}
		return read{data, rev}, err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("confirm %s on the leader: %w", key, err)
	}
	return r.data, r.rev, nil
}

// errBehind is an answer older than a revision of the same key the caller
// already saw. A revision never goes away without a newer one (a record's
// removal leaves a deletion marker), so such an answer came from a copy
// that lags, or from a server that still believes it leads the stream: one
// just back from a partition answers leader reads and refuses CAS writes
// from its old store until it hears the new leader's term. Transient.
var errBehind = fmt.Errorf("%w: an answer older than a revision already seen", errLagging)

// conflictsBeforePause is how many CAS conflicts in a row are retried at
// once before the retries pause (see conflictPause).
const conflictsBeforePause = 3

// ErrContended means a CAS kept losing to concurrent writers.
var ErrContended = errors.New("record changed concurrently too often")

// errWatcherClosed means a listing's watch ended before its initial values.
var errWatcherClosed = errors.New("watcher closed")

// Get reads and decodes the record at key with its revision. A missing key
// is jetstream.ErrKeyNotFound.
func Get[T any](ctx context.Context, kv jetstream.KeyValue, key string) (*T, uint64, error) {
	e, err := get(ctx, &pacer{}, kv, key)
	if err != nil {
		return nil, 0, err
	}
	v, err := decode[T](key, e.Value())
	if err != nil {
		return nil, 0, err
	}
	return v, e.Revision(), nil
}

func get(ctx context.Context, p *pacer, kv jetstream.KeyValue, key string) (jetstream.KeyValueEntry, error) {
	e, err := retried(ctx, p, func(ctx context.Context) (jetstream.KeyValueEntry, error) { return kv.Get(ctx, key) })
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	return e, nil
}

func decode[T any](key string, data []byte) (*T, error) {
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		return nil, fmt.Errorf("decode %s: %w", key, err)
	}
	return &v, nil
}

// List decodes every record whose key matches filter (a KV key pattern
// such as "agent.*"), in one pass of a filtered watch over the current
// values: no round trip per key. A cancelled ctx is an error, never a
// partial list; a pass that stalls (no entry for AttemptTimeout) is
// started again. On a kv WithLeader, a pass must reach the last revision
// the leader held for filter after the first pass: one that ends short of
// it came from a copy that lags, and is made again.
func List[T any](ctx context.Context, kv jetstream.KeyValue, filter string) ([]T, error) {
	p := &pacer{}
	leader, _ := kv.(leaderGetter)
	var mark leaderMark
	for {
		out, reached, err := listOnce[T](ctx, kv, filter)
		if err == nil && leader != nil {
			err = mark.behind(ctx, reached, func(ctx context.Context) (uint64, error) { return leader.leaderRev(ctx, filter) })
		}
		if err == nil {
			return out, nil
		}
		if again, err := p.retry(ctx, err); !again {
			return nil, fmt.Errorf("list %s: %w", filter, err)
		}
	}
}

// leaderMark is the leader's last sequence for what one call reads, asked
// once, after the call's first read: every message stored before the call
// began is at or below it, and a later read need only reach it. Asked
// again, it would move on with every write, and a read of keys written all
// the time might never catch up.
type leaderMark struct {
	last  uint64
	asked bool
}

// behind is errLagging when a read that got as far as reached (a stream
// sequence) came from a copy behind its leader: when the leader held a
// later one. ask reads the leader's last.
func (m *leaderMark) behind(ctx context.Context, reached uint64, ask func(context.Context) (uint64, error)) error {
	if !m.asked {
		last, err := attempt(ctx, ask)
		if err != nil {
			return err
		}
		m.last, m.asked = last, true
	}
	if m.last > reached {
		return fmt.Errorf("%w: read up to %d, the leader holds %d", errLagging, reached, m.last)
	}
	return nil
}

// errLagging is a read answered by a copy of a stream that is behind its
// leader.
var errLagging = errors.New("read from a copy behind its leader")

// listOnce is one pass of List. Its time limit is on silence, not on the
// whole pass, so a long listing that keeps arriving is not cut short.
// reached is the last revision it saw, deletions included.
func listOnce[T any](ctx context.Context, kv jetstream.KeyValue, filter string) (out []T, reached uint64, err error) {
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	idle := time.AfterFunc(AttemptTimeout, func() { cancel(errNoAnswer) })
	defer idle.Stop()
	// The watch lives as long as wctx: the client unsubscribes when it ends.
	// Deletions come too: the last revision may be one.
	w, err := kv.Watch(wctx, filter)
	if err != nil {
		return nil, 0, noAnswer(ctx, wctx, err)
	}
	defer func() {
		_ = w.Stop()
		// The client's callback blocks on a full channel; empty it so the
		// subscription can close (which closes the channel).
		go func() {
			for range w.Updates() {
			}
		}()
	}()
	out = []T{}
	for {
		select {
		case <-wctx.Done():
			return nil, 0, noAnswer(ctx, wctx, wctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				if wctx.Err() != nil {
					return nil, 0, noAnswer(ctx, wctx, wctx.Err())
				}
				return nil, 0, errWatcherClosed
			}
			if e == nil { // the initial values are all in
				return out, reached, nil
			}
			idle.Reset(AttemptTimeout)
			reached = max(reached, e.Revision())
			if e.Operation() != jetstream.KeyValuePut {
				continue
			}
			v, err := decode[T](e.Key(), e.Value())
			if err != nil {
				return nil, 0, err
			}
			out = append(out, *v)
		}
	}
}

// Update applies change to the record at key by CAS until it sticks. change
// sees a fresh copy each attempt and reports whether it changed anything;
// when it did not, nothing is written. With create set, a missing record
// starts as the zero T and is written with Create.
//
// Under retry a write can land without its answer reaching us, or land
// although a stale leader refused it (see UpdateRev). The next read then
// finds either the very bytes written (taken as this call's write: change
// is not asked again) or a record changed further by someone else, which
// change is asked about as usual. So change must decide from
// the record it is given (a state transition), as every CAS change must.
// opts can make the writes of finished records expire (ExpireFinished).
func Update[T any](ctx context.Context, kv jetstream.KeyValue, key string, create bool, change func(*T) (bool, error), opts ...Option[T]) (*T, bool, error) {
	v, _, changed, err := UpdateRev(ctx, kv, key, create, change, opts...)
	return v, changed, err
}

// refusedAt is the revision a CAS refusal says the key is at ("wrong last
// sequence: N", JetStream's 10071), if it says one.
func refusedAt(err error) (uint64, bool) {
	e, ok := errors.AsType[*jetstream.APIError](err)
	if !ok || e.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		return 0, false
	}
	_, n, ok := strings.Cut(e.Description, ": ")
	if !ok {
		return 0, false
	}
	at, err := strconv.ParseUint(n, 10, 64)
	return at, err == nil
}

// unsure is a write whose outcome is unknown: it may have landed.
type unsure struct {
	base uint64 // the revision it was written over
	data []byte
}

// landed reports whether the revision rev holding data is one of the
// unsure writes.
func landed(writes []unsure, rev uint64, data []byte) bool {
	for _, w := range writes {
		if rev > w.base && bytes.Equal(data, w.data) {
			return true
		}
	}
	return false
}

// UpdateRev is Update that also returns the record's revision: the one
// written, or the one read when nothing changed.
//
// The call keeps the highest revision of key it has seen (AtLeast sets the
// first): an answer older than that, or a miss with no deletion marker
// after it, is stale and asked again after a pause (errBehind). So is a
// CAS refusal that names a revision older than that, and its write counts
// as one that may have landed, like one whose answer was lost: a stale
// leader refuses at once while the leader stores the write. And a miss
// the leader confirms is checked once more with every server that
// believes it leads (leadersLast): the leader read may have been answered
// by a stale one.
func UpdateRev[T any](ctx context.Context, kv jetstream.KeyValue, key string, create bool, change func(*T) (bool, error), opts ...Option[T]) (*T, uint64, bool, error) {
	o := newOptions(opts)
	p := &pacer{}
	var writes []unsure
	leader, _ := kv.(leaderGetter)
	confirmed := leader == nil // nothing to confirm with
	seen := o.atLeast
	// mine is the result of finding one of this call's unsure writes.
	mine := func(rev uint64, data []byte) (*T, uint64, bool, error) {
		v, err := decode[T](key, data)
		if err != nil {
			return nil, 0, false, err
		}
		return v, rev, true, nil
	}
	// stale pauses before the next attempt after what (a read, a leader
	// read, a refusal) answered at revision at, older than seen.
	stale := func(what string, at uint64) error {
		confirmed = leader == nil
		err := fmt.Errorf("%s of %s at %d after %d: %w", what, key, at, seen, errBehind)
		if again, err := p.retry(ctx, err); !again {
			return fmt.Errorf("update %s: %w", key, err)
		}
		return nil
	}
	for conflicts := 0; conflicts < casAttempts; {
		v, rev := o.cur, o.rev
		o.cur = nil // the caller's copy serves the first attempt only
		if v == nil {
			e, err := get(ctx, p, kv, key)
			switch {
			case err == nil && e.Revision() < seen:
				if err := stale("read", e.Revision()); err != nil {
					return nil, 0, false, err
				}
				continue
			case err == nil && landed(writes, e.Revision(), e.Value()):
				return mine(e.Revision(), e.Value())
			case err == nil:
				if v, err = decode[T](key, e.Value()); err != nil {
					return nil, 0, false, err
				}
				rev = e.Revision()
			case errors.Is(err, jetstream.ErrKeyNotFound) && create:
				v = new(T)
			case errors.Is(err, jetstream.ErrKeyNotFound) && leader != nil && (!confirmed || seen > 0):
				// Missing, as read: the leader says whether it is.
				confirmed = true
				data, lrev, lerr := confirm(ctx, leader, key)
				switch {
				case lerr != nil:
					return nil, 0, false, lerr
				case lrev < seen:
					if err := stale("leader read", lrev); err != nil {
						return nil, 0, false, err
					}
					continue
				case data == nil:
					// No record, as a server that believes it leads says:
					// unless another one holds a later revision.
					last, lerr := Retried(ctx, func(ctx context.Context) (uint64, error) { return leader.leadersLast(ctx, key) })
					if lerr != nil {
						return nil, 0, false, fmt.Errorf("confirm %s on the leader: %w", key, lerr)
					}
					if last <= lrev {
						return nil, 0, false, err
					}
					seen = max(seen, last)
					if err := stale("leader read", lrev); err != nil {
						return nil, 0, false, err
					}
					continue
				case landed(writes, lrev, data):
					return mine(lrev, data)
				}
				if v, err = decode[T](key, data); err != nil {
					return nil, 0, false, err
				}
				rev = lrev
			default:
				return nil, 0, false, err
			}
		}
		seen = max(seen, rev)
		changed, err := change(v)
		if err == nil && !changed && !confirmed {
			// Nothing to write, as read: the leader says whether that
			// read was current.
			confirmed = true
			data, lrev, lerr := confirm(ctx, leader, key)
			switch {
			case lerr != nil:
				return nil, 0, false, lerr
			case lrev < seen:
				if err := stale("leader read", lrev); err != nil {
					return nil, 0, false, err
				}
				continue
			case data == nil && rev != 0:
				return nil, 0, false, jetstream.ErrKeyNotFound // gone since
			case data != nil && lrev != rev && landed(writes, lrev, data):
				return mine(lrev, data)
			case data != nil && lrev != rev:
				// It was not: decide again on the leader's.
				if o.cur, err = decode[T](key, data); err != nil {
					return nil, 0, false, err
				}
				o.rev = lrev
				continue
			}
		}
		if err != nil || !changed {
			return v, rev, false, err
		}
		data, err := json.Marshal(v)
		if err != nil {
			return nil, 0, false, fmt.Errorf("encode %s: %w", key, err)
		}
		written, err := attempt(ctx, func(ctx context.Context) (uint64, error) { return o.write(ctx, kv, key, data, rev, v) })
		switch {
		case err == nil:
			return v, written, true, nil
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists):
			if at, ok := refusedAt(err); ok && at < seen {
				// A refusal from a store that lacks a revision already
				// seen: a server that still believes it leads answered
				// first, while the leader may have stored the write.
				writes = append(writes, unsure{base: rev, data: data})
				if err := stale("refusal", at); err != nil {
					return nil, 0, false, err
				}
				continue
			}
			// Another writer got there first, or our own earlier write, or
			// the read was stale: direct gets are served by followers too,
			// and one can lag just after a leader change. Read again at
			// once, as ever; a run of conflicts (longer than a race among
			// a few writers) pauses so that a lagging follower catches up.
			conflicts++
			if conflicts > conflictsBeforePause {
				if err := conflictPause(ctx, conflicts); err != nil {
					return nil, 0, false, fmt.Errorf("update %s: %w", key, err)
				}
			}
			continue
		}
		if full := storefull.Mark(kv.Bucket(), err); full != nil {
			// Refused for room: nothing landed, and a retry would not fit.
			return nil, 0, false, fmt.Errorf("update %s: %w", key, full)
		}
		writes = append(writes, unsure{base: rev, data: data})
		if again, err := p.retry(ctx, err); !again {
			return nil, 0, false, fmt.Errorf("update %s: %w", key, err)
		}
	}
	return nil, 0, false, fmt.Errorf("update %s: %w", key, ErrContended)
}

// Create writes v at key, which must not hold a record yet, retrying
// transient errors: one round trip when all is well. A retry can find the
// key taken by this call's own earlier write, whose answer was lost, or a
// caller's retry can find the record its first attempt made; mine says
// whether a stored record is such a one (the same identity, the same
// request), and then Create succeeds with that record and its revision.
// Otherwise it returns v as written. A key taken by another record is
// jetstream.ErrKeyExists.
func Create[T any](ctx context.Context, kv jetstream.KeyValue, key string, v *T, mine func(stored *T) bool) (*T, uint64, error) {
	rev, stored, err := create(ctx, kv, key, v, mine)
	switch {
	case err != nil:
		return nil, 0, err
	case stored == nil:
		return v, rev, nil
	}
	return stored, rev, nil
}

// create is Create; stored is nil when the record at key is v itself.
func create[T any](ctx context.Context, kv jetstream.KeyValue, key string, v *T, mine func(stored *T) bool) (uint64, *T, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return 0, nil, fmt.Errorf("encode %s: %w", key, err)
	}
	p := &pacer{}
	for freed := 0; freed < casAttempts; { // transient failures are bounded by ctx
		rev, err := attempt(ctx, func(ctx context.Context) (uint64, error) { return kv.Create(ctx, key, data) })
		if err == nil {
			return rev, nil, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			if full := storefull.Mark(kv.Bucket(), err); full != nil {
				return 0, nil, fmt.Errorf("create %s: %w", key, full)
			}
			if again, err := p.retry(ctx, err); !again {
				return 0, nil, fmt.Errorf("create %s: %w", key, err)
			}
			continue
		}
		e, err := get(ctx, p, kv, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			freed++ // deleted meanwhile: the key is free again
			continue
		}
		if err != nil {
			return 0, nil, fmt.Errorf("create %s: %w", key, err)
		}
		if bytes.Equal(e.Value(), data) {
			return e.Revision(), nil, nil
		}
		stored, err := decode[T](key, e.Value())
		if err != nil {
			return 0, nil, err
		}
		if !mine(stored) {
			return 0, nil, fmt.Errorf("create %s: %w", key, jetstream.ErrKeyExists)
		}
		return e.Revision(), stored, nil
	}
	return 0, nil, fmt.Errorf("create %s: %w", key, ErrContended)
}
