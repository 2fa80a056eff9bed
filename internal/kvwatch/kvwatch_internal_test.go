package kvwatch

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// A consumer is refused only when the stream's leader sees its server's
// copy as not current; the leader itself, a current follower and a
// standalone server are fine.
func TestLagging(t *testing.T) {
	stream := &jetstream.ClusterInfo{Leader: "n1", Replicas: []*jetstream.PeerInfo{
		{Name: "n2", Current: true}, {Name: "n3", Current: false, Lag: 4200},
	}}
	for _, tc := range []struct {
		stream, cons *jetstream.ClusterInfo
		want         string
	}{
		{stream, &jetstream.ClusterInfo{Leader: "n1"}, ""},
		{stream, &jetstream.ClusterInfo{Leader: "n2"}, ""},
		{stream, &jetstream.ClusterInfo{Leader: "n3"}, "n3"},
		{nil, nil, ""},
		{stream, &jetstream.ClusterInfo{}, ""},
	} {
		var on string
		if tc.cons != nil {
			on = tc.cons.Leader
		}
		if got := lagging(tc.stream, tc.cons); got != tc.want {
			t.Errorf("consumer on %q: lagging %q, want %q", on, got, tc.want)
		}
	}
}
