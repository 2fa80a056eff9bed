package monitors

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/chime-nats/chime/subjects"
)

// Caps on what a monitor delivers.
const (
	// MaxLineBytes bounds one line; a longer one is cut, and says so.
	MaxLineBytes = 2048
	// MaxBatchLines bounds the lines of one batch (one monitor.emit, one
	// envelope); a source with more sends several batches.
	MaxBatchLines = 100
	// BatchWindow is how long a batch gathers lines after its first.
	BatchWindow = 200 * time.Millisecond
	// FloodFor is how long a monitor may lose lines to its token bucket,
	// batch after batch, before it is stopped.
	FloodFor = 30 * time.Second
	// MaxEmitBody is the body limit of monitor.emit: MaxBatchLines lines
	// of MaxLineBytes with JSON's escapes.
	MaxEmitBody = 256 << 10
)

// CapLine is line cut to MaxLineBytes at a character boundary, with the
// count of the bytes cut, and invalid UTF-8 replaced.
func CapLine(line string) string {
	line = strings.ToValidUTF8(strings.TrimRight(line, "\r\n"), "\uFFFD")
	if len(line) <= MaxLineBytes || capped(line) {
		return line
	}
	n := MaxLineBytes
	for n > 0 && !utf8.RuneStart(line[n]) {
		n--
	}
	return fmt.Sprintf("%s… [%d bytes cut]", line[:n], len(line)-n)
}

// capped reports whether line is CapLine's cut already (a source cuts
// its lines as it queues them, and the batch cuts them again): cut twice,
// the second would count the first's suffix as the bytes cut.
func capped(line string) bool {
	i := strings.LastIndex(line, "… [")
	if i < 0 || i > MaxLineBytes || !strings.HasSuffix(line, " bytes cut]") {
		return false
	}
	_, err := strconv.Atoi(line[i+len("… [") : len(line)-len(" bytes cut]")])
	return err == nil
}

// filter is a monitor's match and exclude.
type filter struct{ match, exclude *regexp.Regexp }

// newFilter compiles m's expressions (checked when it started).
func newFilter(m *Monitor) filter {
	var f filter
	if m.Match != "" {
		f.match, _ = regexp.Compile(m.Match)
	}
	if m.Exclude != "" {
		f.exclude, _ = regexp.Compile(m.Exclude)
	}
	return f
}

func (f filter) keep(line string) bool {
	return (f.match == nil || f.match.MatchString(line)) && (f.exclude == nil || !f.exclude.MatchString(line))
}

// Batch is what one batch of a source's lines delivers.
type Batch struct {
	Seq   int64
	Lines []string
	// Suppressed is how many lines the token bucket dropped in this batch
	// and since the last batch delivered: one "N events suppressed" line
	// says so.
	Suppressed int64
	// Cursor is an in-chime source's position after the batch (a KV
	// revision), kept in the envelope so that a batch stored whose count
	// never reached the record can still be counted (Store.adopt).
	Cursor string
}

// Empty reports whether the batch delivers nothing.
func (b *Batch) Empty() bool { return len(b.Lines) == 0 }

// Apply folds batch seq of lines into m as they arrive at now, under
// pace: the lines match and exclude keep, cut to MaxLineBytes, as many as
// the token bucket and max_events let through. It returns what to
// deliver and, when the batch ends the monitor, why (flood, max_events).
// It changes m's counts, bucket and flood clock, and nothing else: the
// caller stores them. Pure, so any replica computes the same.
//
// dropped counts lines the source itself dropped before this batch (an
// in-chime source whose buffer was full): they count as suppressed.
func Apply(m *Monitor, seq int64, lines []string, dropped int64, now time.Time, pace Pace) (Batch, string) {
	f := newFilter(m)
	var kept []string
	for _, l := range lines {
		l = CapLine(l)
		if f.keep(l) {
			kept = append(kept, l)
		} else {
			m.Filtered++
		}
	}
	b := Batch{Seq: seq}
	m.Suppressed += dropped
	m.PendingSuppressed += dropped
	if len(kept) == 0 {
		m.NextSeq = seq + 1
		return b, ""
	}
	at := now.UTC()
	m.LastEventAt = &at
	allowed := m.take(len(kept), now, pace)
	if m.MaxEvents > 0 {
		allowed = min(allowed, int(max(m.MaxEvents-m.Events, 0)))
	}
	dropped += int64(len(kept) - allowed)
	m.Suppressed += int64(len(kept) - allowed)
	m.PendingSuppressed += int64(len(kept) - allowed)
	b.Lines = kept[:allowed]
	if len(b.Lines) > 0 {
		b.Suppressed, m.PendingSuppressed = m.PendingSuppressed, 0
		m.Events += int64(len(b.Lines))
		m.Batches++
	}
	m.NextSeq = seq + 1
	switch {
	case m.MaxEvents > 0 && m.Events >= m.MaxEvents:
		return b, ReasonMaxEvents
	case dropped == 0:
		m.FloodSince = nil
	case m.FloodSince == nil:
		m.FloodSince = &at
	case now.Sub(*m.FloodSince) >= FloodFor:
		return b, ReasonFlood
	}
	return b, ""
}

// take refills m's bucket to now and takes up to n tokens: how many it
// took.
func (m *Monitor) take(n int, now time.Time, pace Pace) int {
	if m.Bucket == nil {
		m.Bucket = &Bucket{Tokens: float64(pace.Burst), At: now}
	}
	if d := now.Sub(m.Bucket.At); d > 0 {
		m.Bucket.Tokens = min(float64(pace.Burst), m.Bucket.Tokens+d.Seconds()*pace.Rate)
		m.Bucket.At = now.UTC()
	}
	took := min(n, int(m.Bucket.Tokens))
	m.Bucket.Tokens -= float64(took)
	return took
}

// EventEnvelopeID is the stable envelope ID of a monitor's batch seq.
func EventEnvelopeID(id string, seq int64) string { return fmt.Sprintf("monitor_%s_%d", id, seq) }

// EventData is the data of a monitor_event delivery.
type EventData struct {
	MonitorID   string   `json:"monitor_id"`
	Description string   `json:"description"`
	Seq         int64    `json:"seq"`
	Lines       []string `json:"lines"`
	Suppressed  int64    `json:"suppressed,omitempty"`
	Cursor      string   `json:"cursor,omitempty"`
}

// SuppressedLine is the line that stands for lines the bucket dropped.
func SuppressedLine(n int64) string {
	if n == 1 {
		return "1 event suppressed"
	}
	return fmt.Sprintf("%d events suppressed", n)
}

// EventEnvelope is batch b of monitor m as its monitor_event: external
// evidence, named by the monitor's description.
func EventEnvelope(m *Monitor, b *Batch, at time.Time) subjects.Envelope {
	data, _ := subjects.EncodeJSON(EventData{MonitorID: m.ID, Description: m.Description, Seq: b.Seq, Lines: b.Lines, Suppressed: b.Suppressed, Cursor: b.Cursor})
	var text strings.Builder
	fmt.Fprintf(&text, "Monitor %s (%s):", m.ID, m.Description)
	for _, l := range b.Lines {
		text.WriteString("\n" + l)
	}
	if b.Suppressed > 0 {
		text.WriteString("\n" + SuppressedLine(b.Suppressed))
	}
	return subjects.Envelope{
		ID: EventEnvelopeID(m.ID, b.Seq), AgentID: m.AgentID, Kind: subjects.KindMonitorEvent, At: at.UTC(),
		Source: subjects.Source{Type: "monitor", ID: m.ID}, Trust: subjects.TrustExternal, Text: text.String(), Data: data,
	}
}
