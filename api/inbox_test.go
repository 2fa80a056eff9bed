package api_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/subjects"
)

// TestInboxFetchAndAck: an agent reads its own deliveries through chime,
// oldest first; what it has not acked comes again, what it acked does not,
// and other agents' deliveries never show.
func TestInboxFetchAndAck(t *testing.T) {
	_, nc := startChime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ann, _ := client.New(nc, "ann")
	ben, _ := client.New(nc, "ben")
	for i := range 3 {
		if _, err := ann.CreateTimer(ctx, int64(20+10*i), 0, "ann"); err != nil {
			t.Fatal(err)
		}
		if _, err := ben.CreateTimer(ctx, 20, 0, "ben"); err != nil {
			t.Fatal(err)
		}
	}
	var first *subjects.InboxFetchReply
	for deadline := time.Now().Add(10 * time.Second); ; {
		var err error
		if first, err = ann.FetchInbox(ctx, 0, time.Second); err != nil {
			t.Fatal(err)
		}
		if len(first.Deliveries) == 3 || time.Now().After(deadline) {
			break
		}
	}
	if len(first.Deliveries) != 3 || first.Acked != 0 {
		t.Fatalf("first fetch: %+v", first)
	}
	for i, d := range first.Deliveries {
		var env subjects.Envelope
		if err := json.Unmarshal(d.Envelope, &env); err != nil || env.AgentID != "ann" || env.Kind != subjects.KindTimerFired {
			t.Fatalf("delivery %d: %s %v", i, d.Envelope, err)
		}
		if i > 0 && d.Seq <= first.Deliveries[i-1].Seq {
			t.Fatalf("out of order: %+v", first.Deliveries)
		}
	}
	// Not acked: the same again; max bounds it; after reads beyond.
	if again, err := ann.FetchInbox(ctx, 2, 0); err != nil || len(again.Deliveries) != 2 || again.Deliveries[0].Seq != first.Deliveries[0].Seq {
		t.Fatalf("again: %+v %v", again, err)
	}
	var beyond subjects.InboxFetchReply
	if err := subjects.DecodeReply(request(t, nc, subjects.Agent("ann", subjects.ActionInboxFetch),
		`{"after":`+jsonNum(first.Deliveries[1].Seq)+`}`).Data, &beyond); err != nil || len(beyond.Deliveries) != 1 || beyond.Deliveries[0].Seq != first.Deliveries[2].Seq {
		t.Fatalf("after the 2nd: %+v %v", beyond, err)
	}
	// Acked up to the 2nd: only the 3rd comes; an older ack moves nothing.
	if acked, err := ann.AckInbox(ctx, first.Deliveries[1].Seq); err != nil || acked != first.Deliveries[1].Seq {
		t.Fatalf("ack: %d %v", acked, err)
	}
	if acked, err := ann.AckInbox(ctx, first.Deliveries[0].Seq); err != nil || acked != first.Deliveries[1].Seq {
		t.Fatalf("an older ack: %d %v", acked, err)
	}
	if rest, err := ann.FetchInbox(ctx, 0, 0); err != nil || len(rest.Deliveries) != 1 || rest.Deliveries[0].Seq != first.Deliveries[2].Seq ||
		rest.Acked != first.Deliveries[1].Seq {
		t.Fatalf("after the ack: %+v %v", rest, err)
	}
	// A wait ends with the next delivery.
	if _, err := ann.AckInbox(ctx, first.Deliveries[2].Seq); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	go func() {
		time.Sleep(300 * time.Millisecond)
		_, _ = ann.CreateTimer(context.Background(), 1, 0, "late")
	}()
	waited, err := ann.FetchInbox(ctx, 0, subjects.MaxInboxWait)
	if err != nil || len(waited.Deliveries) != 1 || time.Since(start) > 4*time.Second {
		t.Fatalf("a waiting fetch: %+v %v after %v", waited, err, time.Since(start))
	}
	// Another agent sees only its own.
	if empty, err := ben.FetchInbox(ctx, 0, 0); err != nil || len(empty.Deliveries) != 3 {
		t.Fatalf("ben's: %+v %v", empty, err)
	}
}

func jsonNum(n uint64) string { b, _ := json.Marshal(n); return string(b) }

// TestInboxBadInput: every refusal names what is wrong, and moves nothing.
func TestInboxBadInput(t *testing.T) {
	_, nc := startChime(t)
	for _, c := range []struct{ action, body, code, msg string }{
		{subjects.ActionInboxFetch, `{"max":0}`, subjects.CodeInvalidRequest, "max must be a whole number from 1 to 256"},
		{subjects.ActionInboxFetch, `{"max":257}`, subjects.CodeInvalidRequest, "max must be a whole number from 1 to 256"},
		{subjects.ActionInboxFetch, `{"max":1.5}`, subjects.CodeInvalidRequest, "max must be a whole number from 1 to 256"},
		{subjects.ActionInboxFetch, `{"wait_ms":60000}`, subjects.CodeInvalidRequest, "wait_ms must be a whole number from 0 to 5000"},
		{subjects.ActionInboxFetch, `{"after":-1}`, subjects.CodeInvalidRequest, ""},
		{subjects.ActionInboxFetch, `{"consumer":"x"}`, subjects.CodeInvalidRequest, ""},
		{subjects.ActionInboxFetch, `[]`, subjects.CodeInvalidJSON, ""},
		{subjects.ActionInboxAck, `{}`, subjects.CodeInvalidRequest, "seq is required"},
		{subjects.ActionInboxAck, `{"seq":0}`, subjects.CodeInvalidRequest, ""},
		{subjects.ActionInboxAck, `{"seq":"5"}`, subjects.CodeInvalidRequest, ""},
		{subjects.ActionInboxAck, `{"seq":99999}`, subjects.CodeInvalidRequest, "seq 99999 is beyond the inbox's last delivery 0"},
	} {
		assertError(t, c.action+" "+c.body, request(t, nc, subjects.Agent("cal", c.action), c.body).Data, c.code, c.msg)
	}
	var r subjects.InboxFetchReply
	if err := subjects.DecodeReply(request(t, nc, subjects.Agent("cal", subjects.ActionInboxFetch), ``).Data, &r); err != nil || r.Acked != 0 || len(r.Deliveries) != 0 {
		t.Fatalf("after the refusals: %+v %v", r, err)
	}
}
