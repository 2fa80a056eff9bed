// Package kvrec owns how chime reads and writes JSON records in JetStream
// KV buckets: the one read-modify-write loop (read, decide, write by CAS on
// the revision, decide again when another writer got there first) and the
// listing of the records under a key filter.
package kvrec

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// attempts bounds retries of an update that keeps losing the race.
const attempts = 16

// ErrContended means a CAS kept losing to concurrent writers.
var ErrContended = errors.New("record changed concurrently too often")

// Get reads and decodes the record at key with its revision. A missing key
// is jetstream.ErrKeyNotFound.
func Get[T any](ctx context.Context, kv jetstream.KeyValue, key string) (*T, uint64, error) {
	e, err := kv.Get(ctx, key)
	if err != nil {
		return nil, 0, err
	}
	var v T
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		return nil, 0, fmt.Errorf("decode %s: %w", key, err)
	}
	return &v, e.Revision(), nil
}

// List decodes every record whose key matches filter (a KV key pattern
// such as "agent.*"), in one pass of a filtered watch over the current
// values: no round trip per key. A cancelled ctx is an error, never a
// partial list.
func List[T any](ctx context.Context, kv jetstream.KeyValue, filter string) ([]T, error) {
	w, err := kv.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	out := []T{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("watcher closed")
			}
			if e == nil { // the initial values are all in
				return out, nil
			}
			var v T
			if err := json.Unmarshal(e.Value(), &v); err != nil {
				return nil, fmt.Errorf("decode %s: %w", e.Key(), err)
			}
			out = append(out, v)
		}
	}
}

// Update applies change to the record at key by CAS until it sticks. change
// sees a fresh copy each attempt and reports whether it changed anything;
// when it did not, nothing is written. With create set, a missing record
// starts as the zero T and is written with Create.
func Update[T any](ctx context.Context, kv jetstream.KeyValue, key string, create bool, change func(*T) (bool, error)) (*T, bool, error) {
	v, _, changed, err := UpdateRev(ctx, kv, key, create, change)
	return v, changed, err
}

// UpdateRev is Update that also returns the record's revision: the one
// written, or the one read when nothing changed.
func UpdateRev[T any](ctx context.Context, kv jetstream.KeyValue, key string, create bool, change func(*T) (bool, error)) (*T, uint64, bool, error) {
	for range attempts {
		v, rev, err := Get[T](ctx, kv, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) && create {
			v, rev, err = new(T), 0, nil
		}
		if err != nil {
			return nil, 0, false, err
		}
		changed, err := change(v)
		if err != nil || !changed {
			return v, rev, false, err
		}
		data, err := json.Marshal(v)
		if err != nil {
			return nil, 0, false, fmt.Errorf("encode %s: %w", key, err)
		}
		var written uint64
		if rev == 0 {
			written, err = kv.Create(ctx, key, data)
		} else {
			written, err = kv.Update(ctx, key, data, rev)
		}
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
			continue
		}
		if err != nil {
			return nil, 0, false, fmt.Errorf("update %s: %w", key, err)
		}
		return v, written, true, nil
	}
	return nil, 0, false, fmt.Errorf("update %s: %w", key, ErrContended)
}
