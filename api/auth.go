package api

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/chime-nats/chime/subjects"
)

// OperatorAuth holds the SHA-256 hashes of the operator bearer tokens
// (CHIME_OPERATOR_TOKENS_FILE); the tokens themselves are never on disk.
type OperatorAuth struct {
	hashes [][sha256.Size]byte
}

// LoadOperatorTokens reads a file of hex SHA-256 token hashes, one per
// line; blank lines and lines starting with # are skipped. An error names
// the line, never its content.
func LoadOperatorTokens(path string) (*OperatorAuth, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("api: operator tokens: %w", err)
	}
	defer f.Close()
	a := &OperatorAuth{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		b, err := hex.DecodeString(line)
		if err != nil || len(b) != sha256.Size {
			return nil, fmt.Errorf("api: operator tokens: %s line %d: not a hex SHA-256 (64 hex digits)", path, n)
		}
		a.hashes = append(a.hashes, [sha256.Size]byte(b))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("api: operator tokens: %w", err)
	}
	if len(a.hashes) == 0 {
		return nil, fmt.Errorf("api: operator tokens: %s holds no token hash", path)
	}
	return a, nil
}

// Enabled reports whether tokens are required.
func (a *OperatorAuth) Enabled() bool { return a != nil && len(a.hashes) > 0 }

// allow checks the request's bearer token against every hash, without
// stopping at the first match, so the time says nothing about which.
func (a *OperatorAuth) allow(r *http.Request) bool {
	scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	if !strings.EqualFold(scheme, "Bearer") || token == "" {
		return false
	}
	h := sha256.Sum256([]byte(token))
	match := 0
	for i := range a.hashes {
		match |= subtle.ConstantTimeCompare(h[:], a.hashes[i][:])
	}
	return match == 1
}

// operatorOnly reports the routes that need an operator: control, and the
// agent-scoped reads.
func operatorOnly(path string) bool {
	return strings.HasPrefix(path, "/api/control/") || strings.HasPrefix(path, "/api/agents/")
}

// guard answers 401 to operator routes without a valid token.
func (a *OperatorAuth) guard(next http.Handler) http.Handler {
	if !a.Enabled() {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if operatorOnly(r.URL.Path) && !a.allow(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="chime"`)
			writeJSON(w, http.StatusUnauthorized, subjects.MarshalError(&subjects.Error{Code: subjects.CodeUnauthorized, Message: "an operator bearer token is required"}))
			return
		}
		next.ServeHTTP(w, r)
	})
}
