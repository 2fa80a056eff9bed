package secret

import (
	"strings"
	"testing"
)

func TestTokens(t *testing.T) {
	a, b := NewToken("chime_x_"), NewToken("chime_x_")
	if a == b || !strings.HasPrefix(a, "chime_x_") || len(a) != len("chime_x_")+43 {
		t.Errorf("tokens %q %q", a, b)
	}
	if h := Hash(a); len(h) != 64 || h == Hash(b) || strings.Contains(h, a) {
		t.Errorf("hash %q", h)
	}
}
