package kvrec_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/testwait"
)

// TestHistoryMissConfirmedOnTheLeader reads a record from a history
// stream whose direct gets are also answered by a copy that lacks it: a
// mirror with MirrorDirect, filtered to other agents, joins the stream's
// direct-get queue group as a server back from a partition does while it
// catches up (about half the reads go to it). Every read finds the record:
// a miss is confirmed with the stream's leader, which holds a later
// message on the record's subject than the copy, and the read is made
// again. Without that, the wait fire redelivered after its wait was
// archived found no wait and was acknowledged with its ending never
// delivered.
func TestHistoryMissConfirmedOnTheLeader(t *testing.T) {
	js := startEngine(t).jetstream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	h := kvrec.History{JS: js, Stream: "HIST", Prefix: "history.rec"}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "HIST", Subjects: []string{"history.rec.>"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "HIST_COPY", MirrorDirect: true,
		Mirror: &jetstream.StreamSource{Name: "HIST", FilterSubject: "history.rec.others.>"}}); err != nil {
		t.Fatal(err)
	}
	// The copy joins the direct gets once it has mirrored a message.
	other, _ := json.Marshal(rec{ID: "o1"})
	if _, err := js.Publish(ctx, h.Subject("others", "o1"), other); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 5*time.Second, func() bool {
		m, err := js.Conn().Request("$JS.API.DIRECT.GET.HIST", []byte(`{"seq":1}`), time.Second)
		return err == nil && m.Header.Get(jetstream.StreamHeader) == "HIST_COPY"
	}, "the copy answering direct gets")
	data, _ := json.Marshal(rec{ID: "r1", Changes: 1})
	if _, err := js.Publish(ctx, h.Subject("a", "r1"), data); err != nil {
		t.Fatal(err)
	}
	idOf := func(r *rec) string { return r.ID }
	for i := range 40 {
		got, err := kvrec.HistoryGet(ctx, h, "a", "r1", idOf)
		if err != nil || got.ID != "r1" {
			t.Fatalf("read %d: %+v, %v; want the record", i, got, err)
		}
	}
	// A record in no copy is not found, once the leader agrees.
	if _, err := kvrec.HistoryGet(ctx, h, "a", "r2", idOf); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("a record never archived: %v, want not found", err)
	}
}
