package callbacks

import (
	"strings"
	"testing"
)

func TestTokens(t *testing.T) {
	a, b := NewToken(), NewToken()
	if a == b || !strings.HasPrefix(a, "chime_cb_") || len(a) != len("chime_cb_")+43 {
		t.Errorf("tokens %q %q", a, b)
	}
	if h := HashToken(a); len(h) != 64 || h == HashToken(b) || strings.Contains(h, a) {
		t.Errorf("hash %q", h)
	}
}
