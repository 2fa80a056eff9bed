package subjects_test

import (
	"regexp"
	"testing"
	"time"

	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waits"
)

// TestDerivedIDs: the ID a request_id derives is stable, looks like a
// random one (prefix and 22 base-62 digits, a valid ID), and differs by
// agent, by request_id and by kind.
func TestDerivedIDs(t *testing.T) {
	shape := regexp.MustCompile(`^(tmr|wait)_[0-9A-Za-z]{22}$`)
	ids := map[string]bool{}
	for _, id := range []string{
		subjects.TimerIDFor("a", "r"), subjects.TimerIDFor("b", "r"), subjects.TimerIDFor("a", "s"),
		subjects.WaitIDFor("a", "r"), subjects.TimerIDFor("a", ""), subjects.TimerIDFor("a.", "r"),
	} {
		if !shape.MatchString(id) || subjects.ValidateID("id", id) != nil || ids[id] {
			t.Errorf("derived ID %q: bad shape or repeated", id)
		}
		ids[id] = true
	}
	// Pinned: stable across calls, replicas and versions (a change would
	// make retries across an upgrade miss).
	if got := subjects.TimerIDFor("demo", "req-1"); got != pinnedTimerID {
		t.Errorf("TimerIDFor(demo, req-1) = %s, was %s", got, pinnedTimerID)
	}
}

const pinnedTimerID = "tmr_7jsuR27Q4foenuXD2NK0Zb"

// TestRequestKeyIsTheRequestsMeaning: two bodies that ask the same get the
// same key; any field that changes the outcome changes it.
func TestRequestKeyIsTheRequestsMeaning(t *testing.T) {
	timer := func(body string) subjects.RequestKey {
		t.Helper()
		var r timers.CreateTimerRequest
		if err := subjects.DecodeStrict([]byte(body), &r); err != nil {
			t.Fatal(err)
		}
		spec, err := r.Validate(timers.TimerLimits{})
		if err != nil {
			t.Fatal(err)
		}
		return spec.Request
	}
	base := timer(`{"duration_ms":1000,"summary":"s","request_id":"r"}`)
	if base.RequestID != "r" || len(base.RequestHash) != 32 {
		t.Fatalf("key %+v", base)
	}
	if got := timer(`{"request_id":"r","interval_ms":null,"summary":"s","duration_ms":1000,"authority_class":""}`); got != base {
		t.Errorf("same timer request, another key: %+v", got)
	}
	for _, body := range []string{
		`{"duration_ms":1001,"summary":"s","request_id":"r"}`,
		`{"duration_ms":1000,"interval_ms":1000,"summary":"s","request_id":"r"}`,
		`{"duration_ms":1000,"summary":"S","request_id":"r"}`,
		`{"duration_ms":1000,"summary":"s","authority_class":"op","request_id":"r"}`,
	} {
		if got := timer(body); got.RequestHash == base.RequestHash {
			t.Errorf("%s: the same hash as another request", body)
		}
	}
	if got := timer(`{"duration_ms":1000}`); got != (subjects.RequestKey{}) {
		t.Errorf("no request_id, key %+v", got)
	}

	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	wait := func(body string, at time.Time) subjects.RequestKey {
		t.Helper()
		spec, err := waits.DecodeWaitRequest([]byte(body), at, "")
		if err != nil {
			t.Fatal(err)
		}
		return spec.Request
	}
	w := wait(`{"seconds":60,"request_id":"r"}`, now)
	if got := wait(`{"minutes":1,"request_id":"r"}`, now.Add(time.Second)); got != w {
		t.Errorf("the same duration a second later, another key: %+v", got)
	}
	if got := wait(`{"seconds":60,"tz":"UTC","request_id":"r"}`, now); got != w {
		t.Errorf("explicit UTC, another key: %+v", got)
	}
	for _, body := range []string{`{"seconds":61,"request_id":"r"}`, `{"seconds":60,"tz":"Asia/Tokyo","request_id":"r"}`} {
		if got := wait(body, now); got.RequestHash == w.RequestHash {
			t.Errorf("%s: the same hash as another request", body)
		}
	}
	u := wait(`{"until":"2027-01-01T09:00:00Z","request_id":"r"}`, now)
	if got := wait(`{"until":"2027-01-01 10:00:00+01:00","request_id":"r"}`, now.Add(time.Hour)); got != u {
		t.Errorf("the same instant, another key: %+v", got)
	}
	if got := wait(`{"until":"2027-01-01 09:00","request_id":"r"}`, now); got != u {
		t.Errorf("the same naive instant in UTC, another key: %+v", got)
	}
}
