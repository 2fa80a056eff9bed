// Package storefull owns telling a JetStream write refused for lack of
// room from every other failure: a full store (the server's or the
// account's limit) or one bucket at its own byte limit. kvrec stops
// retrying such a write, the api answers it storage_full or bucket_full,
// and the engine's storage monitor probes with it.
package storefull

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrStorageFull means the JetStream store has no room: the server's (or
// the account's) store limit is reached and every write to any stream
// fails until space is freed. Waiting a second does not help, so kvrec
// does not retry it.
var ErrStorageFull = errors.New("JetStream storage is full")

// ErrBucketFull means one bucket or stream is at its own byte limit and
// refuses what would grow it (chime's buckets discard new): the rest of
// the store still takes writes.
var ErrBucketFull = errors.New("bucket at its byte limit")

// BucketFullError is ErrBucketFull for a bucket known by name.
type BucketFullError struct {
	Bucket string
	Err    error // the engine's answer
}

func (e *BucketFullError) Error() string {
	return fmt.Sprintf("bucket %s: %v: %v", e.Bucket, ErrBucketFull, e.Err)
}

// Is makes errors.Is(err, ErrBucketFull) hold.
func (e *BucketFullError) Is(target error) bool { return target == ErrBucketFull }
func (e *BucketFullError) Unwrap() error        { return e.Err }

// JetStream's error codes for a write refused for room (nats-server's
// errors.json).
const (
	// JSInsufficientResourcesErr: the server's store is over its limit.
	// On a write it means only that; elsewhere (a consumer's placement in
	// a cluster with a peer restarting) it is transient, see transientCode.
	codeInsufficientResources = 10023
	// JSAccountResourcesExceededErr: the account's store limit.
	codeAccountResourcesExceeded = 10002
	// JSStorageResourcesExceededErr: a stream's max bytes cannot be
	// reserved (making or growing one).
	codeStorageResourcesExceeded = 10047
	// JSStreamStoreFailedF: a store failure; "maximum bytes exceeded" is
	// a discard-new stream at its byte limit.
	codeStreamStoreFailed = 10077
)

// Of tells a write's error that is about room: ErrStorageFull for a full
// store, ErrBucketFull (or the *BucketFullError it carries) for one bucket
// at its limit, nil for anything else. Only a write's error says this: a
// consumer's placement in a cluster answers "insufficient resources" too
// while a peer restarts (kvrec retries that as transient).
func Of(err error) error {
	if err == nil {
		return nil
	}
	if e, ok := errors.AsType[*BucketFullError](err); ok {
		return e
	}
	switch {
	case errors.Is(err, ErrStorageFull):
		return ErrStorageFull
	case errors.Is(err, ErrBucketFull):
		return ErrBucketFull
	}
	code, desc := apiError(err)
	switch code {
	case codeInsufficientResources, codeAccountResourcesExceeded, codeStorageResourcesExceeded:
		return ErrStorageFull
	case codeStreamStoreFailed:
		if strings.Contains(desc, "maximum bytes exceeded") {
			return ErrBucketFull
		}
		if strings.Contains(desc, "no space left") {
			return ErrStorageFull
		}
	}
	return nil
}

// apiError is the JetStream error code and description err carries, from
// either client API.
func apiError(err error) (int, string) {
	if e, ok := errors.AsType[*jetstream.APIError](err); ok {
		return int(e.ErrorCode), e.Description
	}
	if e, ok := errors.AsType[*nats.APIError](err); ok {
		return int(e.ErrorCode), e.Description
	}
	return 0, ""
}

// Mark wraps err, a write's error to bucket, so that callers see
// ErrStorageFull or a *BucketFullError naming the bucket; nil when err is
// not about room.
func Mark(bucket string, err error) error {
	switch Of(err) {
	case nil:
		return nil
	case ErrStorageFull:
		return fmt.Errorf("%w: %w", ErrStorageFull, err)
	default:
		return &BucketFullError{Bucket: bucket, Err: err}
	}
}
