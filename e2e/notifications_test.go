package e2e_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/chime-nats/chime/notifications"
)

// TestCLINotifications: the built binary sends, lists, marks read and
// clears notifications; a SIGKILL and a restart of chime keep them, with
// their guid and sequence.
func TestCLINotifications(t *testing.T) {
	natsAddr := freeAddr(t)
	env := []string{"CHIME_DATA_DIR=" + t.TempDir(), "CHIME_NATS_LISTEN=" + natsAddr, "CHIME_NOTIFICATIONS_MAX=3"}
	p := startServe(t, "notes", env...)
	var ids []string
	for _, msg := range []string{"one", "two", "three", "four"} {
		out, errOut, code := chimeCLI(t, natsAddr, "notify", "send", msg, "--agent", "clin", "--title", "T", "--type", "success", "--priority", "10")
		var rep notifications.NotifyReply
		if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || rep.Message != notifications.NotificationSentText {
			t.Fatalf("notify send: exit %d, %q %s", code, out, errOut)
		}
		ids = append(ids, rep.ID)
	}
	list := func() notifications.ListNotificationsReply {
		t.Helper()
		out, errOut, code := chimeCLI(t, natsAddr, "notify", "list", "--agent", "clin")
		var h notifications.ListNotificationsReply
		if code != 0 || json.Unmarshal([]byte(out), &h) != nil {
			t.Fatalf("notify list: exit %d, %q %s", code, out, errOut)
		}
		return h
	}
	h := list()
	if h.Count != 3 || h.Notifications[0].ID != ids[1] || h.Notifications[2].Message != "four" ||
		h.Notifications[0].Priority != 10 || h.Notifications[0].Type != "success" || h.Notifications[0].Title != "T" {
		t.Fatalf("history of three, the oldest evicted: %+v", h)
	}
	if out, errOut, code := chimeCLI(t, natsAddr, "notify", "read", ids[1], "--agent", "clin"); code != 0 || !strings.Contains(out, "Marked 1 notifications as read") {
		t.Fatalf("notify read: exit %d, %q %s", code, out, errOut)
	}
	before := list()

	p.kill() // SIGKILL
	startServe(t, "notes-again", env...)
	if after := list(); !reflect.DeepEqual(after, before) {
		t.Fatalf("after a restart: %+v, before %+v", after, before)
	}
	if out, errOut, code := chimeCLI(t, natsAddr, "notify", "clear", "--agent", "clin"); code != 0 || !strings.Contains(out, "All notifications cleared") {
		t.Fatalf("notify clear: exit %d, %q %s", code, out, errOut)
	}
	if h := list(); h.Count != 0 || h.GUID == before.GUID {
		t.Fatalf("after a clear: %+v", h)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"notify"}, 2, "send, list, read, clear or follow"},
		{[]string{"notify", "frob"}, 2, `unknown notify command "frob"`},
		{[]string{"notify", "send"}, 2, "one message"},
		{[]string{"notify", "send", "m", "--type", "loud"}, 1, "invalid_request: Invalid notification type: loud"},
		{[]string{"notify", "send", "m", "--priority", "15"}, 1, "invalid_request: Invalid notification priority: 15"},
	} {
		if _, errOut, code := chimeCLI(t, natsAddr, tc.args...); code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("chime %v: exit %d, %q, want %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}
