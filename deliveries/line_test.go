package deliveries_test

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/chime-nats/chime/deliveries"
)

// TestLine: a delivery's line is one line whatever its text holds: the
// sequence, kind, ID and trust, then the text quoted (newlines and control
// characters escaped), or the data without text, cut at MaxLineText on a
// character boundary with what was cut counted.
func TestLine(t *testing.T) {
	long := "x" + strings.Repeat("é", deliveries.MaxLineText) // two bytes each after one: the cut falls inside one
	for _, tc := range []struct {
		name, envelope, want string
	}{
		{"a timer", `{"id":"timer_tmr_x_1","agent_id":"a","kind":"timer_fired","trust":"system","text":"check the CI run","data":{"timer_id":"tmr_x"}}`,
			`41 timer_fired timer_tmr_x_1 system: "check the CI run"`},
		{"lines and escapes", `{"id":"msg_1","kind":"message","trust":"external","text":"two\nlines \u001b[31mred\u001b[0m \"q\""}`,
			`41 message msg_1 external: "two\nlines \x1b[31mred\x1b[0m \"q\""`},
		{"data without text", `{"id":"intervention_iv_y","kind":"intervention","trust":"operator","data":{ "action" : "stop" }}`,
			`41 intervention intervention_iv_y operator: {"action":"stop"}`},
		{"nothing", `{"id":"intervention_iv_z","kind":"intervention","trust":"operator"}`,
			`41 intervention intervention_iv_z operator: ""`},
		{"odd words", `{"id":"a b","kind":"","trust":"system"}`, `41 - "a b" system: ""`},
		{"not an envelope", `[1,2]`, `41 undecodable envelope: "[1,2]"`},
	} {
		got := string(deliveries.Line(deliveries.InboxDelivery{Seq: 41, Envelope: json.RawMessage(tc.envelope)}))
		if got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
	}
	env, _ := json.Marshal(map[string]string{"id": "msg_2", "kind": "message", "trust": "external", "text": long})
	got := string(deliveries.Line(deliveries.InboxDelivery{Seq: 7, Envelope: env}))
	if strings.Contains(got, "\n") || !utf8.ValidString(got) || !strings.HasSuffix(got, `" (+4098 bytes)`) ||
		len(got) > deliveries.MaxLineText+100 {
		t.Fatalf("a long text: %d bytes, ends %q", len(got), got[len(got)-30:])
	}
}
