package engine_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/subjects"
)

// TestProvisionAllowsDirectGetsInPlace: an inbox stream made before
// inbox.fetch read by direct gets (no AllowDirect) is updated in place at
// start: direct gets allowed, every other setting and every delivery kept.
func TestProvisionAllowsDirectGetsInPlace(t *testing.T) {
	js := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	limited := topo
	limited.InboxMaxBytes, limited.InboxMaxPerAgent = 64<<20, 100
	if _, err := engine.Provision(ctx, js, limited); err != nil {
		t.Fatal(err)
	}
	// The stream as the previous version made it.
	st, err := js.Stream(ctx, engine.InboxStream)
	if err != nil {
		t.Fatal(err)
	}
	old := st.CachedInfo().Config
	old.AllowDirect = false
	if _, err := js.UpdateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := js.Publish(ctx, subjects.Inbox("a"), []byte{byte('0' + i)}); err != nil {
			t.Fatal(err)
		}
	}
	before, err := st.Info(ctx)
	if err != nil || before.Config.AllowDirect {
		t.Fatalf("the old stream: %+v %v", before.Config, err)
	}

	if _, err := engine.Provision(ctx, js, limited); err != nil {
		t.Fatal(err)
	}
	after, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !after.Config.AllowDirect {
		t.Fatal("direct gets still not allowed after provisioning")
	}
	want := before.Config
	want.AllowDirect = true
	if !reflect.DeepEqual(after.Config, want) {
		t.Errorf("provisioning changed more than AllowDirect:\n before %+v\n after  %+v", before.Config, after.Config)
	}
	if after.State.Msgs != 10 || after.State.FirstSeq != before.State.FirstSeq || after.State.LastSeq != before.State.LastSeq {
		t.Errorf("deliveries before %+v, after %+v", before.State, after.State)
	}
	m, err := st.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subjects.Inbox("a")))
	if err != nil || string(m.Data) != "0" {
		t.Fatalf("the first delivery: %v", err)
	}
}
