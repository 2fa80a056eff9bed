package deliveries

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxLineText is how much of an envelope's text (or, without text, its
// data) a line carries. A line goes to a model as one event (a harness's
// monitor wakes its session with it): a callback's 256 KiB message would
// crowd out everything else, and the full envelope stays a fetch away.
const MaxLineText = 4 << 10

// Line is d as one line of text for a reader that is a model, without the
// newline: its sequence, kind, envelope ID and trust, then its text quoted
// as a Go string ("\n" for a newline, control characters escaped, so an
// external caller's text can neither end the line nor drive a terminal),
// or without text its data as compact JSON; either cut at MaxLineText, the
// rest counted:
//
//	41 timer_fired timer_tmr_x_1 system: "check the CI run"
//	42 intervention intervention_iv_y operator: {"action":"stop"}
//	43 message msg_ev_z external: "first 4 KiB…" (+12000 bytes)
//
// Trust comes before the text because it says how far to believe it.
func Line(d InboxDelivery) []byte {
	var env struct {
		ID    string          `json:"id"`
		Kind  string          `json:"kind"`
		Trust string          `json:"trust"`
		Text  string          `json:"text"`
		Data  json.RawMessage `json:"data"`
	}
	out := strconv.AppendUint(nil, d.Seq, 10)
	if err := json.Unmarshal(d.Envelope, &env); err != nil {
		// Never stored by chime; shown rather than dropped, as JSON text.
		out = append(out, " undecodable envelope: "...)
		return appendCut(out, string(d.Envelope), true)
	}
	for _, w := range []string{env.Kind, env.ID, env.Trust} {
		out = appendWord(append(out, ' '), w)
	}
	out = append(out, ": "...)
	if env.Text == "" && len(env.Data) > 0 {
		var compact bytes.Buffer
		if json.Compact(&compact, env.Data) == nil {
			return appendCut(out, compact.String(), false)
		}
	}
	return appendCut(out, env.Text, true)
}

// appendWord appends w as it is when it is one plain word (chime's kinds,
// IDs and trust levels are), else quoted; "-" when empty.
func appendWord(out []byte, w string) []byte {
	if w == "" {
		return append(out, '-')
	}
	for _, c := range w {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("_-.:", c)) {
			return strconv.AppendQuoteToGraphic(out, w)
		}
	}
	return append(out, w...)
}

// appendCut appends s, quoted when quote, cut to MaxLineText bytes at a
// character boundary, and how many bytes were cut.
func appendCut(out []byte, s string, quote bool) []byte {
	cut := 0
	if len(s) > MaxLineText {
		n := MaxLineText
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s, cut = s[:n], len(s)-n
	}
	if quote {
		out = strconv.AppendQuoteToGraphic(out, s)
	} else {
		out = append(out, s...)
	}
	if cut > 0 {
		out = append(out, " (+"...)
		out = strconv.AppendInt(out, int64(cut), 10)
		out = append(out, " bytes)"...)
	}
	return out
}
