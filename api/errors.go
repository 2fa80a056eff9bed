package api

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/storefull"
	"github.com/chime-nats/chime/subjects"
	"github.com/nats-io/nats.go/jetstream"
)

// retryAfter is the hint given with a storage outage: about how long a
// JetStream leader election takes to settle.
const retryAfter = time.Second

// unavailableMessage is the text of a storage outage.
const unavailableMessage = "chime storage is unavailable (a NATS leader election?); retry in 1s"

// storageFullMessage is the text of a write refused because JetStream's
// store is full.
const storageFullMessage = "chime storage is full: nothing can be written until an operator frees space; what is stored is kept"

// bucketFullMessage is the text of a write refused because its bucket is
// at its byte limit.
func bucketFullMessage(bucket string) string {
	if bucket == "" {
		return "chime's store for this is full (at its byte limit); retry once older records end and expire, or ask an operator to raise the limit"
	}
	return "chime's store for this (" + bucket + ") is full (at its byte limit); retry once older records end and expire, or ask an operator to raise the limit"
}

// canceledMessage is the text of a request cut short by its caller
// leaving or by this replica stopping.
const canceledMessage = "request cancelled (the caller left or this replica is stopping); retry"

// retryError is a wire error with a hint of when to try again, for the
// surfaces to pass on as Retry-After: a request whose storage work was
// still failing transiently, or still waiting, when its deadline ended;
// or a create over the agent's rate.
type retryError struct {
	wire  *subjects.Error
	after time.Duration
}

func (e *retryError) Error() string { return e.wire.Error() }
func (e *retryError) Unwrap() error { return e.wire }

// retryHinted is an operation's error that says when to retry
// (quotas.RateLimited).
type retryHinted interface {
	error
	RetryAfter() time.Duration
}

// answerError maps an operation's error to what the caller is told: the
// *subjects.Error the operation chose; storage_full or bucket_full when a
// write was refused for room (see storefull.Of); unavailable, with a retry hint,
// when storage did not get through before the deadline (a leader election,
// a server restart: a wait, not a bug); internal for anything else.
func answerError(err error) error {
	if e, ok := errors.AsType[*subjects.Error](err); ok {
		if h, ok := errors.AsType[retryHinted](err); ok {
			return &retryError{wire: e, after: h.RetryAfter()}
		}
		return e
	}
	// Room before outage: a full store's error is also JetStream's
	// "insufficient resources", which looks transient.
	// A read retried until its deadline is no write, whatever it last saw
	// (storefull.Of).
	if full := storefull.Of(err); full != nil && !errors.Is(err, kvrec.ErrUnavailable) {
		if b, ok := errors.AsType[*storefull.BucketFullError](full); ok {
			return &subjects.Error{Code: subjects.CodeBucketFull, Message: bucketFullMessage(b.Bucket)}
		}
		if errors.Is(full, storefull.ErrBucketFull) {
			return &subjects.Error{Code: subjects.CodeBucketFull, Message: bucketFullMessage("")}
		}
		return &subjects.Error{Code: subjects.CodeStorageFull, Message: storageFullMessage}
	}
	// A missing bucket or stream is being re-created by the healer.
	if kvrec.Transient(err) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return &retryError{wire: &subjects.Error{Code: subjects.CodeUnavailable, Message: unavailableMessage}, after: retryAfter}
	}
	if errors.Is(err, context.Canceled) {
		// The caller left, or this replica is stopping: not a bug, and
		// another replica can take the retry.
		return &retryError{wire: &subjects.Error{Code: subjects.CodeUnavailable, Message: canceledMessage}, after: retryAfter}
	}
	return &subjects.Error{Code: subjects.CodeInternal, Message: "internal error"}
}

// retryAfterSeconds is the Retry-After value for an answer, if it has one:
// whole seconds, rounded up, at least 1.
func retryAfterSeconds(err error) (string, bool) {
	e, ok := errors.AsType[*retryError](err)
	if !ok {
		return "", false
	}
	return strconv.Itoa(max(1, int((e.after+time.Second-1)/time.Second))), true
}

// finish maps, logs and counts the outcome of one request on endpoint;
// what names the request in the log ("request", "callback"). An outage is
// a warning (the caller is told to retry); internal is an error, a bug.
func (o *Operations) finish(endpoint, what string, err error, attrs ...any) error {
	outcome := "ok"
	if err != nil {
		answer := answerError(err)
		outcome = subjects.AsError(answer).Code
		if _, hinted := errors.AsType[*retryError](answer); hinted && outcome == subjects.CodeUnavailable {
			if errors.Is(err, context.Canceled) {
				o.log.Debug(what+" cancelled", append(attrs, "err", err)...)
			} else {
				o.log.Warn(what+" hit unavailable storage", append(attrs, "err", err)...)
			}
		} else if outcome == subjects.CodeStorageFull || outcome == subjects.CodeBucketFull {
			// Debug: a full store refuses every write, and the storage
			// monitor already warns once; the count is in the metric.
			o.log.Debug(what+" refused: no room", append(attrs, "err", err)...)
		} else if outcome == subjects.CodeInternal {
			o.log.Error(what+" failed", append(attrs, "err", err)...)
		}
		err = answer
	}
	o.requests.WithLabelValues(endpoint, outcome).Inc()
	return err
}
