package subjects

import (
	"errors"
	"reflect"
	"slices"
	"testing"
)

func TestDecodeNotify(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		src  NotifySource
		want Notification
	}{
		{"agent defaults", `{"message":"done"}`, FromAgent,
			Notification{Message: "done", Type: NotifyInfo, Priority: PriorityHigh, DisplayTime: 30}},
		{"http defaults", `{"message":"done"}`, FromHTTP,
			Notification{Message: "done", Type: NotifyInfo, Priority: PriorityNormal, DisplayTime: 3}},
		{"every field", `{"message":"m","title":"t","detail":"<b>d</b>","type":"warning","priority":10,"timeout":12.5,"id":"n-1","group":"g"}`, FromAgent,
			Notification{ID: "n-1", Message: "m", Title: "t", Detail: "<b>d</b>", Type: NotifyWarning, Priority: PriorityNormal, DisplayTime: 12.5, Group: "g"}},
		{"display_time alone", `{"message":"m","display_time":7}`, FromHTTP,
			Notification{Message: "m", Type: NotifyInfo, Priority: PriorityNormal, DisplayTime: 7}},
		{"timeout wins", `{"message":"m","timeout":5,"display_time":7}`, FromHTTP,
			Notification{Message: "m", Type: NotifyInfo, Priority: PriorityNormal, DisplayTime: 5}},
		{"non-positive timeout", `{"message":"m","timeout":0}`, FromHTTP,
			Notification{Message: "m", Type: NotifyInfo, Priority: PriorityNormal, DisplayTime: 3}},
		{"non-numeric timeout", `{"message":"m","timeout":"soon"}`, FromHTTP,
			Notification{Message: "m", Type: NotifyInfo, Priority: PriorityNormal, DisplayTime: 3}},
		{"negative timeout from an agent", `{"message":"m","timeout":-4}`, FromAgent,
			Notification{Message: "m", Type: NotifyInfo, Priority: PriorityHigh, DisplayTime: 30}},
		// The HTTP create route's int(display_time) and type.lower().
		{"http whole seconds", `{"message":"m","display_time":2.7}`, FromHTTP,
			Notification{Message: "m", Type: NotifyInfo, Priority: PriorityNormal, DisplayTime: 2}},
		{"http under a second", `{"message":"m","display_time":0.5}`, FromHTTP,
			Notification{Message: "m", Type: NotifyInfo, Priority: PriorityNormal, DisplayTime: 3}},
		{"http seconds as text", `{"message":"m","display_time":" 5 "}`, FromHTTP,
			Notification{Message: "m", Type: NotifyInfo, Priority: PriorityNormal, DisplayTime: 5}},
		{"http fraction as text", `{"message":"m","display_time":"5.5"}`, FromHTTP,
			Notification{Message: "m", Type: NotifyInfo, Priority: PriorityNormal, DisplayTime: 3}},
		{"http type in capitals", `{"message":"m","type":"WARNING"}`, FromHTTP,
			Notification{Message: "m", Type: NotifyWarning, Priority: PriorityNormal, DisplayTime: 3}},
		{"agent fraction kept", `{"message":"m","timeout":2.7}`, FromAgent,
			Notification{Message: "m", Type: NotifyInfo, Priority: PriorityHigh, DisplayTime: 2.7}},
	} {
		got, err := DecodeNotify([]byte(tc.body), tc.src)
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
		{`{"type":"Info","priority":3}`, CodeInvalidRequest, "Invalid notification type: Info"},
		{`{"type":"loud","message":"m"}`, CodeInvalidRequest, "Invalid notification type: loud"},
		{`{"priority":15}`, CodeInvalidRequest, "Invalid notification priority: 15"},
		{`{"priority":"high","message":"m"}`, CodeInvalidRequest, "Invalid notification priority: high"},
		{`{"priority":20.5,"message":"m"}`, CodeInvalidRequest, "Invalid notification priority: 20.5"},
		{`{}`, CodeInvalidRequest, "Message is required"},
		{`{"message":""}`, CodeInvalidRequest, "Message is required"},
		{`{"message":"m","id":"a.b"}`, CodeInvalidID, `id "a.b" may only contain letters, digits, '_' and '-'`},
		{`{"message":"m","colour":"red"}`, CodeInvalidRequest, `unknown field "colour"`},
		{`{"message":3}`, CodeInvalidRequest, "message must be a JSON string, not number"},
		{`{"message":`, CodeInvalidJSON, "malformed JSON: unexpected EOF"},
	} {
		_, err := DecodeNotify([]byte(tc.body), FromAgent)
		var e *Error
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
		_, err := DecodeNotify([]byte(tc.body), FromHTTP)
		var e *Error
		if !errors.As(err, &e) || e.Code != CodeInvalidRequest || e.Message != tc.msg {
			t.Errorf("HTTP %s: got %v, want %s", tc.body, err, tc.msg)
		}
	}
}

func FuzzDecodeNotify(f *testing.F) {
	addSeeds(f, `{"message":"m"}`, `{"type":"x"}`, `{"priority":"20"}`, `{"message":"m","timeout":1e400}`,
		`{"message":"m","title":"t","detail":"<b>d</b>","type":"warning","priority":10,"timeout":12.5,"id":"n-1","group":"g"}`)
	decode := func(body []byte) (*Notification, error) { return DecodeNotify(body, FromAgent) }
	keys := []string{"message", "title", "detail", "type", "priority", "timeout", "display_time", "id", "group"}
	fuzzRequest(f, decode, keys, []string{CodeInvalidJSON, CodeInvalidRequest, CodeInvalidID}, func(t *testing.T, body []byte, n *Notification) {
		if n.Message == "" || n.DisplayTime <= 0 || !slices.Contains(NotificationTypes(), n.Type) || !slices.Contains(NotificationPriorities(), n.Priority) {
			t.Fatalf("accepted %s as %+v", body, n)
		}
		req := map[string]any{"message": n.Message, "title": n.Title, "detail": n.Detail, "type": n.Type,
			"priority": n.Priority, "timeout": n.DisplayTime, "id": n.ID, "group": n.Group}
		if back, err := decode(encodeBody(t, req)); err != nil || *back != *n {
			t.Fatalf("%s accepted as %+v, which reads back as %+v (%v)", body, n, back, err)
		}
	})
}
