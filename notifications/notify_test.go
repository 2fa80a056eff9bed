package notifications_test

import (
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/chime-nats/chime/notifications"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/subjects/subjectstest"
)

func TestDecodeNotify(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		src  notifications.NotifySource
		want notifications.Notification
	}{
		{"agent defaults", `{"message":"done"}`, notifications.FromAgent,
			notifications.Notification{Message: "done", Type: notifications.NotifyInfo, Priority: notifications.PriorityHigh, DisplayTime: 30}},
		{"http defaults", `{"message":"done"}`, notifications.FromHTTP,
			notifications.Notification{Message: "done", Type: notifications.NotifyInfo, Priority: notifications.PriorityNormal, DisplayTime: 3}},
		{"every field", `{"message":"m","title":"t","detail":"<b>d</b>","type":"warning","priority":10,"timeout":12.5,"id":"n-1","group":"g"}`, notifications.FromAgent,
			notifications.Notification{ID: "n-1", Message: "m", Title: "t", Detail: "<b>d</b>", Type: notifications.NotifyWarning, Priority: notifications.PriorityNormal, DisplayTime: 12.5, Group: "g"}},
		{"display_time alone", `{"message":"m","display_time":7}`, notifications.FromHTTP,
			notifications.Notification{Message: "m", Type: notifications.NotifyInfo, Priority: notifications.PriorityNormal, DisplayTime: 7}},
		{"timeout wins", `{"message":"m","timeout":5,"display_time":7}`, notifications.FromHTTP,
			notifications.Notification{Message: "m", Type: notifications.NotifyInfo, Priority: notifications.PriorityNormal, DisplayTime: 5}},
		{"non-positive timeout", `{"message":"m","timeout":0}`, notifications.FromHTTP,
			notifications.Notification{Message: "m", Type: notifications.NotifyInfo, Priority: notifications.PriorityNormal, DisplayTime: 3}},
		{"non-numeric timeout", `{"message":"m","timeout":"soon"}`, notifications.FromHTTP,
			notifications.Notification{Message: "m", Type: notifications.NotifyInfo, Priority: notifications.PriorityNormal, DisplayTime: 3}},
		{"negative timeout from an agent", `{"message":"m","timeout":-4}`, notifications.FromAgent,
			notifications.Notification{Message: "m", Type: notifications.NotifyInfo, Priority: notifications.PriorityHigh, DisplayTime: 30}},
		// The HTTP create route's int(display_time) and type.lower().
		{"http whole seconds", `{"message":"m","display_time":2.7}`, notifications.FromHTTP,
			notifications.Notification{Message: "m", Type: notifications.NotifyInfo, Priority: notifications.PriorityNormal, DisplayTime: 2}},
		{"http under a second", `{"message":"m","display_time":0.5}`, notifications.FromHTTP,
			notifications.Notification{Message: "m", Type: notifications.NotifyInfo, Priority: notifications.PriorityNormal, DisplayTime: 3}},
		{"http seconds as text", `{"message":"m","display_time":" 5 "}`, notifications.FromHTTP,
			notifications.Notification{Message: "m", Type: notifications.NotifyInfo, Priority: notifications.PriorityNormal, DisplayTime: 5}},
		{"http fraction as text", `{"message":"m","display_time":"5.5"}`, notifications.FromHTTP,
			notifications.Notification{Message: "m", Type: notifications.NotifyInfo, Priority: notifications.PriorityNormal, DisplayTime: 3}},
		{"http type in capitals", `{"message":"m","type":"WARNING"}`, notifications.FromHTTP,
			notifications.Notification{Message: "m", Type: notifications.NotifyWarning, Priority: notifications.PriorityNormal, DisplayTime: 3}},
		{"agent fraction kept", `{"message":"m","timeout":2.7}`, notifications.FromAgent,
			notifications.Notification{Message: "m", Type: notifications.NotifyInfo, Priority: notifications.PriorityHigh, DisplayTime: 2.7}},
	} {
		got, err := notifications.DecodeNotify([]byte(tc.body), tc.src)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !reflect.DeepEqual(*got, tc.want) {
			t.Errorf("%s: got %+v, want %+v", tc.name, *got, tc.want)
		}
	}
}

func TestDecodeNotifyErrors(t *testing.T) {
	for _, tc := range []struct{ body, code, msg string }{
		// Agent Zero's order: type, then priority, then message.
		{`{"type":"Info","priority":3}`, subjects.CodeInvalidRequest, "Invalid notification type: Info"},
		{`{"type":"loud","message":"m"}`, subjects.CodeInvalidRequest, "Invalid notification type: loud"},
		{`{"priority":15}`, subjects.CodeInvalidRequest, "Invalid notification priority: 15"},
		{`{"priority":"high","message":"m"}`, subjects.CodeInvalidRequest, "Invalid notification priority: high"},
		{`{"priority":20.5,"message":"m"}`, subjects.CodeInvalidRequest, "Invalid notification priority: 20.5"},
		{`{}`, subjects.CodeInvalidRequest, "Message is required"},
		{`{"message":""}`, subjects.CodeInvalidRequest, "Message is required"},
		{`{"message":"m","id":"a.b"}`, subjects.CodeInvalidID, `id "a.b" may only contain letters, digits, '_' and '-'`},
		{`{"message":"m","colour":"red"}`, subjects.CodeInvalidRequest, `unknown field "colour"`},
		{`{"message":3}`, subjects.CodeInvalidRequest, "message must be a JSON string, not number"},
		{`{"message":`, subjects.CodeInvalidJSON, "malformed JSON: unexpected EOF"},
	} {
		_, err := notifications.DecodeNotify([]byte(tc.body), notifications.FromAgent)
		var e *subjects.Error
		if !errors.As(err, &e) || e.Code != tc.code || e.Message != tc.msg {
			t.Errorf("%s: got %v, want %s: %s", tc.body, err, tc.code, tc.msg)
		}
	}
	// The HTTP create route's order: message first; type without regard
	// to case, named as sent.
	for _, tc := range []struct{ body, msg string }{
		{`{"type":"bogus"}`, "Message is required"},
		{`{"type":"Info","priority":3}`, "Message is required"},
		{`{"type":"Loud","message":"m"}`, "Invalid notification type: Loud"},
		{`{"priority":15,"message":"m"}`, "Invalid notification priority: 15"},
	} {
		_, err := notifications.DecodeNotify([]byte(tc.body), notifications.FromHTTP)
		var e *subjects.Error
		if !errors.As(err, &e) || e.Code != subjects.CodeInvalidRequest || e.Message != tc.msg {
			t.Errorf("HTTP %s: got %v, want %s", tc.body, err, tc.msg)
		}
	}
}

func FuzzDecodeNotify(f *testing.F) {
	subjectstest.AddSeeds(f, `{"message":"m"}`, `{"type":"x"}`, `{"priority":"20"}`, `{"message":"m","timeout":1e400}`,
		`{"message":"m","title":"t","detail":"<b>d</b>","type":"warning","priority":10,"timeout":12.5,"id":"n-1","group":"g"}`)
	decode := func(body []byte) (*notifications.Notification, error) {
		return notifications.DecodeNotify(body, notifications.FromAgent)
	}
	keys := []string{"message", "title", "detail", "type", "priority", "timeout", "display_time", "id", "group"}
	subjectstest.Request(f, decode, keys, []string{subjects.CodeInvalidJSON, subjects.CodeInvalidRequest, subjects.CodeInvalidID}, func(t *testing.T, body []byte, n *notifications.Notification) {
		if n.Message == "" || n.DisplayTime <= 0 || !slices.Contains(notifications.NotificationTypes(), n.Type) || !slices.Contains(notifications.NotificationPriorities(), n.Priority) {
			t.Fatalf("accepted %s as %+v", body, n)
		}
		req := map[string]any{"message": n.Message, "title": n.Title, "detail": n.Detail, "type": n.Type,
			"priority": n.Priority, "timeout": n.DisplayTime, "id": n.ID, "group": n.Group}
		if back, err := decode(subjectstest.EncodeBody(t, req)); err != nil || *back != *n {
			t.Fatalf("%s accepted as %+v, which reads back as %+v (%v)", body, n, back, err)
		}
	})
}
