package access_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"testing"
)

func writeHashes(t testing.TB, path string, tokens ...string) {
	t.Helper()
	var b []byte
	for _, tok := range tokens {
		h := sha256.Sum256([]byte(tok))
		b = append(b, hex.EncodeToString(h[:])+"\n"...)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
