package subjects

import (
	"fmt"

	"github.com/nats-io/nuid"
)

// MaxIDLen is the longest agent, timer or other ID that may appear in a subject.
const MaxIDLen = 64

// ValidateID reports whether id may be used as one token of a subject:
// 1-64 characters of [A-Za-z0-9_-]. Anything else (".", "*", ">", spaces)
// would change the meaning of the subject it is put into.
func ValidateID(kind, id string) error {
	if id == "" {
		return &Error{Code: CodeInvalidID, Message: kind + " must not be empty"}
	}
	if len(id) > MaxIDLen {
		return &Error{Code: CodeInvalidID, Message: fmt.Sprintf("%s must be at most %d characters", kind, MaxIDLen)}
	}
	for i := 0; i < len(id); i++ {
		if !idChar(id[i]) {
			return &Error{Code: CodeInvalidID, Message: fmt.Sprintf("%s %q may only contain letters, digits, '_' and '-'", kind, id)}
		}
	}
	return nil
}

func idChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// NewTimerID returns a fresh, subject-safe timer ID.
func NewTimerID() string { return "tmr_" + nuid.Next() }
