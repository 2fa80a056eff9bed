package callbacks

import (
	"strings"
	"testing"
)

func TestTokens(t *testing.T) {
	if a := NewToken(); !strings.HasPrefix(a, TokenPrefix) || HashToken(a) == HashToken(NewToken()) {
		t.Errorf("token %q", a)
	}
}
