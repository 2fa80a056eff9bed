package bench

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestChaosValidatePartition(t *testing.T) {
	base := ChaosOptions{Servers: 3, Replicas: 2, Duration: time.Second, Agents: 1, Every: time.Second}
	for _, tc := range []struct {
		name string
		edit func(*ChaosOptions)
		want string // in the error; empty: valid
	}{
		{"all kinds", func(o *ChaosOptions) { o.Partition = []string{"inbox-leader", "timers-leader", "replica", "node"} }, ""},
		{"unknown kind", func(o *ChaosOptions) { o.Partition = []string{"leader"} }, `unknown kind "leader"`},
		{"with kills", func(o *ChaosOptions) { o.Partition, o.Kill = []string{"node"}, []string{"replica"} }, "exclude each other"},
		{"standalone", func(o *ChaosOptions) { o.Partition, o.Servers = []string{"node"}, 1 }, "needs a cluster"},
	} {
		o := base
		tc.edit(&o)
		err := o.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}

// TestPartitionFigures: of what was due between a cut and its heal, the
// figures count what was stored before the heal, and the latest of them.
func TestPartitionFigures(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	r := &chaosRun{start: start, kills: []*killRecord{
		{n: 1, kind: PartitionTimersLeader, target: "n2", cut: true, at: at(10), back: at(20)},
	}}
	items := []item{
		{due: at(5), late: 10 * time.Millisecond},                 // before the cut
		{due: at(11), late: 2 * time.Second},                      // stored at 13: during
		{due: at(12), late: 9 * time.Second},                      // stored at 21: after the heal
		{due: at(19), late: 500 * time.Millisecond},               // stored at 19.5: during
		{due: at(15), lost: true},                                 // never stored
		{due: at(25), late: 30 * time.Second},                     // after the heal
		{due: at(20), late: time.Second, dup: 1},                  // due at the heal: counts, stored after
		{due: time.Time{}, lost: true},                            // due unknown: not placed
		{due: at(10), late: 0},                                    // due at the cut, stored at once
		{due: at(18), late: 2*time.Second - time.Millisecond},     // stored just before the heal
		{due: at(16), late: 4*time.Second + time.Millisecond},     // stored just after it
		{due: at(17), late: 3 * time.Second, dup: 0, lost: false}, // stored at the heal: during
	}
	res := &ChaosResult{KillsByKind: map[string]int{}}
	r.killFigures(res, items, nil)
	if len(res.Kills) != 1 {
		t.Fatalf("kills: %+v", res.Kills)
	}
	k := res.Kills[0]
	c := k.Partition
	if c == nil {
		t.Fatalf("no partition figures: %+v", k)
	}
	// Due in [10, 20]: 11, 12, 19, 15 (lost), 20, 10, 18, 16, 17 = 9.
	// Stored by 20: 11, 19, 10, 18, 17 = 5.
	if c.Due != 9 || c.Stored != 5 {
		t.Errorf("due %d, stored %d, want 9 and 5", c.Due, c.Stored)
	}
	if want := 100 * 5.0 / 9; c.StoredPct < want-0.01 || c.StoredPct > want+0.01 {
		t.Errorf("stored %.2f%%, want %.2f%%", c.StoredPct, want)
	}
	if c.MaxLateMs != 9000 {
		t.Errorf("max lateness %v ms, want 9000", c.MaxLateMs)
	}
	if k.Lost != 1 || k.Duplicated != 1 || res.PartitionsByKind[PartitionTimersLeader] != 1 || len(res.KillsByKind) != 0 {
		t.Errorf("lost %d, dup %d, partitions %v, kills %v", k.Lost, k.Duplicated, res.PartitionsByKind, res.KillsByKind)
	}
}

func TestScrapeDuplicates(t *testing.T) {
	page := "# HELP chime_fire_duplicates_total x\n# TYPE chime_fire_duplicates_total counter\n" +
		"chime_fire_duplicates_total_other 9\nchime_fire_duplicates_total 42\nchime_timer_fires_total 7\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/old/metrics" {
			fmt.Fprint(w, "chime_timer_fires_total 7\n")
			return
		}
		fmt.Fprint(w, page)
	}))
	defer srv.Close()
	n, err := scrapeCounter(t.Context(), srv.Client(), srv.URL+"/metrics", duplicatesMetric)
	if err != nil || n != 42 {
		t.Errorf("scrape: %d, %v; want 42", n, err)
	}
	if _, err := scrapeCounter(t.Context(), srv.Client(), srv.URL+"/old/metrics", duplicatesMetric); err == nil {
		t.Error("a page without the counter gave no error")
	}
	if d := acksDelta(map[string]int{"a": 1, "b": 5}, map[string]int{"a": 4, "b": 5, "c": 100}); d == nil || *d != 3 {
		t.Errorf("delta %v, want 3 (c has no before)", d)
	}
	if d := acksDelta(map[string]int{"a": 1}, map[string]int{}); d != nil {
		t.Errorf("delta %d with no replica in both, want nil", *d)
	}
}
