package subjects

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Error codes on the wire. Callers branch on these, so they are stable.
const (
	CodeInvalidJSON    = "invalid_json"
	CodeInvalidRequest = "invalid_request"
	CodeInvalidID      = "invalid_id"
	CodeTimerNotFound  = "timer_not_found"
	CodeTimerCompleted = "timer_completed"
	CodeUnavailable    = "unavailable"
	CodeInternal       = "internal"
	// CodeQuotaExceeded refuses a create beyond the agent's active timers
	// or waits: retrying helps only once some of them end.
	CodeQuotaExceeded = "quota_exceeded"
	// CodeRateLimited refuses a create beyond the agent's create rate:
	// retrying after the hint it carries helps.
	CodeRateLimited = "rate_limited"
	// CodeStorageFull refuses a write because JetStream's store is full
	// (HTTP 507): nothing of chime's can be written until an operator
	// frees space; what is stored stays.
	CodeStorageFull = "storage_full"
	// CodeBucketFull refuses a write because the bucket it goes to is at
	// its byte limit (HTTP 507): others still take writes; this one again
	// once older records end and expire, or the limit is raised.
	CodeBucketFull = "bucket_full"
	// CodeReplyTooLarge answers, over NATS, a request whose reply would
	// exceed the server's max payload: asking for fewer items (a smaller
	// limit) helps; repeating the same request does not.
	CodeReplyTooLarge = "reply_too_large"
)

// Error is the one error shape of chime's replies:
// {"error":{"code":"<snake_case>","message":"<text>"}}.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Status is the HTTP status of a code a feature owns (zero: the
	// surfaces map the shared codes), so a new code needs no central edit.
	Status int `json:"-"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Is matches another *Error by code, so errors.Is(err, &Error{Code: c}) works
// and the sentinels below can be compared against.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Sentinels for errors.Is; the concrete errors carry their own message.
var (
	ErrInvalidJSON    = &Error{Code: CodeInvalidJSON}
	ErrInvalidRequest = &Error{Code: CodeInvalidRequest}
	ErrInvalidID      = &Error{Code: CodeInvalidID}
	ErrTimerNotFound  = &Error{Code: CodeTimerNotFound}
	ErrTimerCompleted = &Error{Code: CodeTimerCompleted}
	ErrQuotaExceeded  = &Error{Code: CodeQuotaExceeded}
	ErrRateLimited    = &Error{Code: CodeRateLimited}
	ErrStorageFull    = &Error{Code: CodeStorageFull}
	ErrBucketFull     = &Error{Code: CodeBucketFull}
)

// MaxRequestBody is the largest body of a request other than a callback
// (64 KiB): far above any valid one (a 4096-character summary, escaped,
// is under 50 KiB).
const MaxRequestBody = 64 << 10

// BodyTooLarge is the payload_too_large error of a body over limit bytes,
// over HTTP (413) and NATS alike; what names the body: "request",
// "callback".
func BodyTooLarge(what string, limit int64) *Error {
	return &Error{Code: CodePayloadTooLarge, Message: fmt.Sprintf("%s body larger than %d KiB", what, limit>>10)}
}

// ErrReplyTooLarge is the reply_too_large error of a reply of size bytes
// over the server's max payload.
func ErrReplyTooLarge(size int, maxPayload int64) *Error {
	return &Error{Code: CodeReplyTooLarge, Message: fmt.Sprintf(
		"the reply (%d bytes) is larger than the NATS server's max payload (%d bytes); ask for fewer items (a smaller limit), or use HTTP", size, maxPayload)}
}

// ErrorReply is the JSON body that wraps an Error.
type ErrorReply struct {
	Error *Error `json:"error"`
}

// AsError turns any error into a wire error; unknown errors become "internal"
// without their text, which may hold details a caller has no business seeing.
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Code: CodeInternal, Message: "internal error"}
}

// MarshalError encodes err in the wire error shape.
func MarshalError(err error) []byte {
	b, _ := json.Marshal(ErrorReply{Error: AsError(err)})
	return b
}

// DecodeReply decodes a reply body into v, or returns the *Error it carries.
func DecodeReply(data []byte, v any) error {
	var probe struct {
		Error *Error `json:"error"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return &Error{Code: CodeInvalidJSON, Message: "malformed reply: " + err.Error()}
	}
	if probe.Error != nil {
		return probe.Error
	}
	return json.Unmarshal(data, v)
}

// Codes of the access and size rules every surface applies.
const (
	CodeForbidden       = "forbidden"
	CodeUnauthorized    = "unauthorized"
	CodePayloadTooLarge = "payload_too_large"
)
