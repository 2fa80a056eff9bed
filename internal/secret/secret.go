// Package secret owns chime's bearer secrets: how a token is made (256
// random bits behind a prefix that secret scanners can match) and the one
// form in which tokens are stored (hex SHA-256).
package secret

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
)

// NewToken returns a fresh token: prefix and 256 random bits.
func NewToken(prefix string) string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return prefix + base64.RawURLEncoding.EncodeToString(b)
}

// Hash is the stored form of a token: hex SHA-256.
func Hash(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}
