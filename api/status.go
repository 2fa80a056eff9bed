package api

import (
	"net/http"

	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/questions"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
	"github.com/chime-nats/chime/waits"
)

// httpStatus is e's HTTP status: the one its feature gave it, else its
// shared code's.
func httpStatus(e *subjects.Error) int {
	if e.Status != 0 {
		return e.Status
	}
	switch e.Code {
	case subjects.CodeInvalidJSON, subjects.CodeInvalidRequest, subjects.CodeInvalidID,
		waits.CodeInvalidDuration, waits.CodeInvalidTimestamp, waits.CodeTargetInPast, waits.CodeInvalidTimezone:
		return http.StatusBadRequest
	case subjects.CodeTimerNotFound, waits.CodeWaitNotFound, callbacks.CodeTriggerNotFound, questions.CodeQuestionNotFound, tasks.CodeTaskNotFound:
		return http.StatusNotFound
	case subjects.CodeTimerCompleted, waits.CodeWaitExists, callbacks.CodeAgentNotActive, subjects.CodeConflict,
		tasks.CodeTaskHasResult, tasks.CodeTaskOutputOrder:
		return http.StatusConflict
	case subjects.CodeForbidden, tasks.CodeTaskOwned:
		return http.StatusForbidden
	case subjects.CodeUnauthorized:
		return http.StatusUnauthorized
	case subjects.CodeQuotaExceeded, subjects.CodeRateLimited:
		// Both say "too much of this agent", 429's meaning. 403 would say
		// the caller lacks a right (chime's 403 is a refused callback
		// token). rate_limited comes with Retry-After; quota_exceeded
		// without, as waiting alone does not help.
		return http.StatusTooManyRequests
	case subjects.CodePayloadTooLarge:
		return http.StatusRequestEntityTooLarge
	case subjects.CodeReplyTooLarge:
		// The request was valid but asks for more than one reply carries:
		// the caller's to change, like 413, but the reply's size, not the
		// request's.
		return http.StatusUnprocessableEntity
	case subjects.CodeUnavailable:
		return http.StatusServiceUnavailable
	case subjects.CodeStorageFull, subjects.CodeBucketFull:
		// 507: the server cannot store what the request needs; not 503,
		// which says "a moment, then retry".
		return http.StatusInsufficientStorage
	default:
		return http.StatusInternalServerError
	}
}
