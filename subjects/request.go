package subjects

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"unicode"
	"unicode/utf8"
)

// CodeConflict is a create whose request_id was used before for a
// different request.
const CodeConflict = "conflict"

// ErrConflict matches (errors.Is) every conflict error.
var ErrConflict = &Error{Code: CodeConflict}

// MaxRequestIDLen bounds a request_id, in characters (code points).
const MaxRequestIDLen = 128

// ValidateRequestID checks a client-chosen request_id: 1-128 printable
// characters. It never reaches a subject or a key (the record ID is
// derived from it), so anything printable will do.
func ValidateRequestID(id string) error {
	if id == "" {
		return &Error{Code: CodeInvalidRequest, Message: "request_id must not be empty"}
	}
	if n := utf8.RuneCountInString(id); n > MaxRequestIDLen {
		return &Error{Code: CodeInvalidRequest, Message: fmt.Sprintf("request_id must be at most %d characters", MaxRequestIDLen)}
	}
	i := 0
	for _, r := range id {
		i++
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return &Error{Code: CodeInvalidRequest, Message: fmt.Sprintf("request_id must be printable: character %d is %U", i, r)}
		}
	}
	return nil
}

// RequestKey is what a record keeps of the request that created it, so a
// retry of that request (same agent, same request_id) finds it: the
// request_id and a hash of the request in its normalized form. Both are
// empty for a record created without a request_id.
type RequestKey struct {
	RequestID   string `json:"request_id,omitempty"`
	RequestHash string `json:"request_hash,omitempty"`
}

// NewRequestKey keys a validated request_id with the hash of the
// normalized request (a struct of what the request means, so that key
// order, spacing or an explicit null do not make another request). A nil
// id is no key.
func NewRequestKey(id *string, action string, normalized any) (RequestKey, error) {
	if id == nil {
		return RequestKey{}, nil
	}
	b, err := json.Marshal(normalized)
	if err != nil {
		return RequestKey{}, fmt.Errorf("subjects: normalize %s: %w", action, err)
	}
	h := sha256.Sum256(append([]byte(action+"\x00"), b...))
	return RequestKey{RequestID: *id, RequestHash: hex.EncodeToString(h[:16])}, nil
}

// Replays reports whether a record stored with key stored was created by
// a request with this key: the same request_id for the same request.
func (k RequestKey) Replays(stored RequestKey) bool {
	return k.RequestID != "" && k == stored
}

// Conflict is the error of a request whose request_id names a record that
// another request created.
func (k RequestKey) Conflict() error {
	return &Error{Code: CodeConflict, Message: fmt.Sprintf("request_id %q was used for a different request", k.RequestID)}
}

// base62 is nuid's alphabet, so derived IDs look like random ones.
const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// derivedIDLen is the length of a nuid, and of the digits of a derived ID:
// 22 base-62 digits hold the 128 bits taken from the hash.
const derivedIDLen = 22

// derivedID is the ID of the record that agentID's request requestID
// creates: prefix plus 22 base-62 digits of a SHA-256 of the three, so
// every replica, before or after a restart, picks the same key for a
// retry, and the store's create finds the record already there.
func derivedID(prefix, agentID, requestID string) string {
	h := sha256.Sum256([]byte(prefix + "\x00" + agentID + "\x00" + requestID))
	n := new(big.Int).SetBytes(h[:16])
	digits := make([]byte, derivedIDLen)
	base, rem := big.NewInt(int64(len(base62))), new(big.Int)
	for i := derivedIDLen - 1; i >= 0; i-- {
		n.QuoRem(n, base, rem)
		digits[i] = base62[rem.Int64()]
	}
	return prefix + string(digits)
}

// TimerIDFor is the ID of the timer that agentID's create with requestID
// makes.
func TimerIDFor(agentID, requestID string) string { return derivedID("tmr_", agentID, requestID) }

// QuestionIDFor is the ID of the question that agentID's question.ask
// with requestID makes.
func QuestionIDFor(agentID, requestID string) string { return derivedID("q_", agentID, requestID) }

// WaitIDFor is the ID of the wait that agentID's wait.request with
// requestID makes.
func WaitIDFor(agentID, requestID string) string { return derivedID("wait_", agentID, requestID) }
