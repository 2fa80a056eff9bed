package timers

import (
	"errors"
	"testing"
	"time"
)

// TestApplyFireInOrder: occurrences are written in order, each only as the
// one the record expects next; a replica's stale numbering never moves the
// record past occurrences that were not delivered.
func TestApplyFireInOrder(t *testing.T) {
	d0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	iv := int64(1000)
	next := d0
	rec := Timer{ID: "r", Status: TimerActive, Repeat: true, IntervalMs: &iv, NextFireAt: &next, FireCount: 26}
	at := func(s int) time.Time { return d0.Add(time.Duration(s) * time.Second) }
	nextDue := func(s int) *time.Time { t := at(s); return &t }

	// 28 and 30 arrive before 27: not yet.
	for _, n := range []int64{28, 30} {
		if changed, err := applyFire(&rec, n, at(int(n-27)), at(5), nextDue(int(n-26)), at(5)); changed || !errors.Is(err, ErrOutOfOrder) {
			t.Fatalf("occurrence %d before 27: %v %v", n, changed, err)
		}
	}
	// 27, fired late by a new owner that chose d0+4s as the next due time.
	if changed, err := applyFire(&rec, 27, at(0), at(4), nextDue(4), at(4)); !changed || err != nil || rec.FireCount != 27 || !rec.NextFireAt.Equal(at(4)) {
		t.Fatalf("27: %v %v %+v", changed, err, rec)
	}
	// The old owner's 28, due at d0+1s, is superseded: the record expects
	// 28 at d0+4s.
	if changed, err := applyFire(&rec, 28, at(1), at(5), nextDue(2), at(5)); changed || err != nil || rec.FireCount != 27 {
		t.Fatalf("stale 28: %v %v %+v", changed, err, rec)
	}
	if changed, err := applyFire(&rec, 28, at(4), at(4), nextDue(5), at(4)); !changed || err != nil || rec.FireCount != 28 {
		t.Fatalf("28: %v %v %+v", changed, err, rec)
	}
	// A repeat of a written occurrence changes nothing.
	if changed, err := applyFire(&rec, 27, at(0), at(4), nextDue(4), at(9)); changed || err != nil || rec.FireCount != 28 {
		t.Fatalf("repeat of 27: %v %v", changed, err)
	}
}
