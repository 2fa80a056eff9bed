package callbacks

import "github.com/chime-nats/chime/internal/secret"

// TokenPrefix marks chime callback tokens, so secret scanners find them.
const TokenPrefix = "chime_cb_"

// NewToken returns a fresh callback capability token.
func NewToken() string { return secret.NewToken(TokenPrefix) }

// HashToken is the stored form of a token.
func HashToken(token string) string { return secret.Hash(token) }
