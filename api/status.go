package api

import (
	"net/http"

	"github.com/chime-nats/chime/subjects"
)

// httpStatus maps an error code to its HTTP status.
func httpStatus(code string) int {
	switch code {
	case subjects.CodeInvalidJSON, subjects.CodeInvalidRequest, subjects.CodeInvalidID,
		subjects.CodeInvalidDuration, subjects.CodeInvalidTimestamp, subjects.CodeTargetInPast, subjects.CodeInvalidTimezone:
		return http.StatusBadRequest
	case subjects.CodeTimerNotFound, subjects.CodeWaitNotFound, subjects.CodeTriggerNotFound:
		return http.StatusNotFound
	case subjects.CodeTimerCompleted, subjects.CodeWaitExists, subjects.CodeAgentNotActive, subjects.CodeConflict:
		return http.StatusConflict
	case subjects.CodeForbidden:
		return http.StatusForbidden
	case subjects.CodeUnauthorized:
		return http.StatusUnauthorized
	case subjects.CodePayloadTooLarge:
		return http.StatusRequestEntityTooLarge
	case subjects.CodeUnavailable:
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}
