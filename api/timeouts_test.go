package api

import (
	"testing"
	"time"
)

// TestDefaultTimeouts: every phase is bounded, and the write timeout
// leaves room for a slow body plus a request's whole storage deadline, so
// a slow answer (unavailable after 10 s) is not cut off.
func TestDefaultTimeouts(t *testing.T) {
	d := DefaultTimeouts()
	if d.ReadHeader <= 0 || d.Read < d.ReadHeader || d.Idle <= 0 || d.Write < d.Read+requestTimeout {
		t.Fatalf("default timeouts %+v (request timeout %v)", d, requestTimeout)
	}
	got := Timeouts{ReadHeader: time.Second, Write: -1}.orDefaults()
	if want := (Timeouts{ReadHeader: time.Second, Read: d.Read, Write: d.Write, Idle: d.Idle}); got != want {
		t.Fatalf("zero and negative fields take their defaults: got %+v, want %+v", got, want)
	}
}
