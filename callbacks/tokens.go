package callbacks

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
)

// tokenPrefix marks chime callback tokens, so secret scanners find them.
const tokenPrefix = "chime_cb_"

// NewToken returns a fresh capability token: 256 random bits.
func NewToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return tokenPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// HashToken is the stored form of a token: hex SHA-256.
func HashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}
