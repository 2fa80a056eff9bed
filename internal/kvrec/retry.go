package kvrec

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/chime-nats/chime/internal/backoff"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Retry pacing. A healthy round trip takes well under a millisecond and a
// JetStream leader election a few seconds, so one attempt gets at most
// AttemptTimeout (never more than the caller has left) and the waits between
// attempts double from 25 ms up to 500 ms, jittered so that the requests
// stalled by one election do not come back in step. AttemptTimeout is
// also how long an async publish waits for its ack.
const AttemptTimeout = 2 * time.Second

var retries = backoff.Policy{Min: 25 * time.Millisecond, Max: 500 * time.Millisecond}

// ErrUnavailable means JetStream kept failing with transient errors (or
// did not answer) until the caller's deadline: the storage is unavailable
// for now, typically during a leader election or a server restart. It
// wraps the last error seen.
var ErrUnavailable = errors.New("JetStream unavailable")

// errNoAnswer marks one attempt that got no answer within AttemptTimeout
// while the caller still had time: unlike the caller's own deadline, it is
// worth another attempt.
var errNoAnswer = errors.New("no answer from JetStream in time")

// transientCode reports whether a JetStream API error code describes a
// cluster in motion rather than a bad request (nats-server's errors.json).
func transientCode(code uint16) bool {
	switch code {
	case 10004, // JSClusterIncompleteErr: "incomplete results"
		10005, // JSClusterNoPeersErrF: "no suitable peers for placement", while a peer is down
		10008, // JSClusterNotAvailErr: "JetStream system temporarily unavailable" (no meta or stream leader)
		10009, // JSClusterNotLeaderErr: "JetStream cluster can not handle request" (leadership moved)
		10023, // JSInsufficientResourcesErr: also how a restarting peer looks (nats.go retries it too)
		10163, // JSStreamExpectedLastSeqPerSubjectNotReady: CAS "temporarily unavailable"
		10167: // JSStreamTooManyRequests: back pressure
		return true
	}
	return false
}

// Transient reports whether err is the engine being briefly unable to
// answer (a leader election, a restart, a reconnect) rather than an answer:
// the same request is worth sending again within its deadline. A missing
// bucket or stream is not transient (re-creating it is the healer's job),
// nor is the caller's own deadline or cancellation, nor a closed connection.
func Transient(err error) bool {
	if err == nil {
		return false
	}
	for _, target := range []error{
		ErrUnavailable, errNoAnswer,
		nats.ErrTimeout, nats.ErrNoResponders,
		nats.ErrConnectionReconnecting, nats.ErrDisconnected, nats.ErrReconnectBufExceeded,
		jetstream.ErrNoStreamResponse, nats.ErrNoStreamResponse,
		jetstream.ErrNoHeartbeat, nats.ErrNoHeartbeat,
		jetstream.ErrConsumerLeadershipChanged, nats.ErrConsumerLeadershipChanged,
		jetstream.ErrServerShutdown,
		errLagging,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	// The two clients' API error types are distinct; both reach us (KV
	// watches still create their consumers through the legacy API).
	if e, ok := errors.AsType[*jetstream.APIError](err); ok && transientCode(uint16(e.ErrorCode)) {
		return true
	}
	if e, ok := errors.AsType[*nats.APIError](err); ok && transientCode(uint16(e.ErrorCode)) {
		return true
	}
	return false
}

// pacer paces the retries of one call: it decides whether an error is
// worth another attempt and sleeps the backoff.
type pacer struct {
	n int // retries so far
}

// retry reports whether err, from an attempt made under ctx, is worth
// another attempt; if so it has waited the backoff. Otherwise it returns
// the error to give the caller: err itself, or ErrUnavailable wrapping it
// when ctx's deadline ended while the engine was not answering.
func (p *pacer) retry(ctx context.Context, err error) (bool, error) {
	if ctx.Err() != nil {
		return false, ended(ctx, err)
	}
	if !Transient(err) {
		return false, err
	}
	p.n++
	if !retries.Sleep(ctx, p.n-1) {
		return false, ended(ctx, err)
	}
	return true, nil
}

// conflictPause waits out the n-th CAS conflict of one update (n >
// conflictsBeforePause), paced as the retries are.
// Losing races until ctx ends is contention, not unavailability.
func conflictPause(ctx context.Context, n int) error {
	if !retries.Sleep(ctx, n-conflictsBeforePause-1) {
		return fmt.Errorf("%w after %d conflicts: %w", ErrContended, n, ctx.Err())
	}
	return nil
}

// ended is the error of a call whose context ended during or after an
// attempt that failed with err: ErrUnavailable when the deadline passed
// while the engine was not answering, else the caller's own end.
func ended(ctx context.Context, err error) error {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded) && (Transient(err) || errors.Is(err, context.DeadlineExceeded)):
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	case errors.Is(err, ctx.Err()) || !Transient(err):
		return err
	default: // cancelled during the backoff
		return fmt.Errorf("%w after: %w", ctx.Err(), err)
	}
}

// attempt runs op once, bounded by AttemptTimeout (and by ctx). An attempt
// cut short by its own time limit, not the caller's, is marked errNoAnswer.
func attempt[R any](ctx context.Context, op func(context.Context) (R, error)) (R, error) {
	actx, cancel := context.WithTimeoutCause(ctx, AttemptTimeout, errNoAnswer)
	defer cancel()
	r, err := op(actx)
	if err != nil {
		err = noAnswer(ctx, actx, err)
	}
	return r, err
}

// noAnswer marks err as errNoAnswer when it is an attempt's time running
// out while the caller's ctx still runs: a deadline that is not the
// caller's, or actx cancelled by its own time limit.
func noAnswer(ctx, actx context.Context, err error) error {
	if ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, context.Canceled) && errors.Is(context.Cause(actx), errNoAnswer)) {
		return fmt.Errorf("%w (%s): %w", errNoAnswer, AttemptTimeout, err)
	}
	return err
}

// Retried runs op in attempts of AttemptTimeout until it succeeds, fails
// for good, or ctx ends, retrying what an engine restart or a reconnect
// makes fail (a request lost, no responders) with backoff, as every
// record read here does. A deadline that ends while the engine does not
// answer is ErrUnavailable.
func Retried[R any](ctx context.Context, op func(context.Context) (R, error)) (R, error) {
	return retried(ctx, &pacer{}, op)
}

// retried runs op in attempts until it succeeds, fails for good, or ctx
// ends.
func retried[R any](ctx context.Context, p *pacer, op func(context.Context) (R, error)) (R, error) {
	for {
		r, err := attempt(ctx, op)
		if err == nil {
			return r, nil
		}
		if again, err := p.retry(ctx, err); !again {
			return r, err
		}
	}
}
