package api_test

import (
	"net/http"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/engine"
)

// TestPlantedMessagesHarmNoOne: a message in chime's buckets that chime
// did not write (undecodable; a pull's status reply aimed into a bucket,
// which the client library drops; a record naming another agent than its
// key) is passed over: every agent's reads go on. The status reply made
// every notifications read answer 503 until the next real change.
func TestPlantedMessagesHarmNoOne(t *testing.T) {
	for name, m := range map[string]*nats.Msg{
		"not json":      {Subject: "$KV." + engine.NotificationsBucket + ".bob.x", Data: []byte("not json")},
		"status reply":  {Subject: "$KV." + engine.NotificationsBucket + ".bob.y", Header: nats.Header{"Status": []string{"404"}, "Description": []string{"No Messages"}}},
		"bad meta":      {Subject: "$KV." + engine.NotificationsBucket + ".bob", Data: []byte(`{"guid":7}`)},
		"another agent": {Subject: "$KV." + engine.NotificationsBucket + ".carol.z", Data: []byte(`{"id":"z","agent_id":"bob","message":"mine?"}`)},
	} {
		t.Run(name, func(t *testing.T) {
			r, nc := startChime(t)
			notify(t, nc, "bob", `{"message":"real","id":"deploy-7"}`)
			if err := nc.PublishMsg(m); err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			for _, path := range []string{"/api/agents", "/api/agents/bob/notifications", "/api/agents/alice/notifications"} {
				if status, body := getJSON(t, "http://"+r.HTTPAddr(), path); status != http.StatusOK {
					t.Errorf("GET %s: %d %s", path, status, body)
				}
			}
			if h := history(t, r, "bob", -1); h.Count != 1 || h.Notifications[0].ID != "deploy-7" {
				t.Errorf("bob's notifications: %+v", h)
			}
		})
	}
}
