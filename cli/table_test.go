package cli

import (
	"bytes"
	"strings"
	"testing"
)

// TestPrintTable: each list a table of the declared columns its records
// have, long and multi-line values cut to one short cell, the cursor of
// the next page after them; a reply with no list is left to the JSON.
func TestPrintTable(t *testing.T) {
	long := strings.Repeat("x", 100)
	for _, c := range []struct {
		name, reply string
		shown       bool
		want        []string
		not         []string
	}{
		{"one list", `{"timers":[{"id":"tmr_1","status":"active","summary":"line one\nline two","fire_count":3,"extra":1}],"next_cursor":"abc"}`,
			true, []string{"ID     STATUS  FIRE_COUNT  SUMMARY", "tmr_1  active  3           line one line two", "more: cursor=abc"}, []string{"EXTRA", "NEXT_FIRE_AT"}},
		{"two lists", `{"waits":[],"wait_for":[{"id":"w1","status":"active"}],"next_cursor":""}`,
			true, []string{"wait_for (1)", "waits (0)", "(none)"}, []string{"more:"}},
		{"bare list", `[{"id":"q_1","status":"open","summary":"` + long + `"}]`,
			true, []string{"q_1", strings.Repeat("x", maxCell-1) + "…"}, []string{long}},
		{"no list", `{"task_id":"t","status":"running"}`, false, nil, nil},
		{"not JSON", `nope`, false, nil, nil},
	} {
		var b bytes.Buffer
		shown, err := printTable(&b, []byte(c.reply), []string{"id", "status", "next_fire_at", "fire_count", "summary"})
		if err != nil || shown != c.shown {
			t.Errorf("%s: shown %v, %v", c.name, shown, err)
		}
		if !shown && b.Len() > 0 {
			t.Errorf("%s: printed %q and said it did not", c.name, b.String())
		}
		for _, w := range c.want {
			if !strings.Contains(b.String(), w) {
				t.Errorf("%s: no %q in\n%s", c.name, w, b.String())
			}
		}
		for _, n := range c.not {
			if strings.Contains(b.String(), n) {
				t.Errorf("%s: %q in\n%s", c.name, n, b.String())
			}
		}
	}
}
