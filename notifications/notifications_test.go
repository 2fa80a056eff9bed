package notifications_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/chime-nats/chime/notifications"
	"github.com/chime-nats/chime/subjects"
)

func TestDecodeMarkRead(t *testing.T) {
	for _, tc := range []struct {
		body string
		ids  []string
		all  bool
		msg  string // error text; "" accepted
	}{
		// Agent Zero's order: mark_all first, then "none", then "not a list".
		{`{"mark_all":true,"notification_ids":"x"}`, nil, true, ""},
		{`{"mark_all":false,"notification_ids":["a"]}`, []string{"a"}, false, ""},
		{`{"notification_ids":["a"," ","",7,null,"b"]}`, []string{"a", "b"}, false, ""},
		{`{"notification_ids":[7]}`, nil, false, ""},
		{`{}`, nil, false, notifications.NoNotificationIDsText},
		{`{"notification_ids":null}`, nil, false, notifications.NoNotificationIDsText},
		{`{"notification_ids":[]}`, nil, false, notifications.NoNotificationIDsText},
		{`{"notification_ids":""}`, nil, false, notifications.NoNotificationIDsText},
		{`{"notification_ids":0}`, nil, false, notifications.NoNotificationIDsText},
		{`{"notification_ids":false}`, nil, false, notifications.NoNotificationIDsText},
		{`{"notification_ids":{}}`, nil, false, notifications.NoNotificationIDsText},
		{`{"notification_ids":"a"}`, nil, false, notifications.NotificationIDsListText},
		{`{"notification_ids":1}`, nil, false, notifications.NotificationIDsListText},
		{`{"notification_ids":true}`, nil, false, notifications.NotificationIDsListText},
		{`{"notification_ids":{"a":1}}`, nil, false, notifications.NotificationIDsListText},
		{`{"mark_all":1}`, nil, false, "mark_all must be a JSON boolean, not number"},
		{`{"ids":["a"]}`, nil, false, `unknown field "ids"`},
	} {
		ids, all, err := notifications.DecodeMarkRead([]byte(tc.body))
		if tc.msg != "" {
			var e *subjects.Error
			if !errors.As(err, &e) || e.Message != tc.msg || !errors.Is(err, subjects.ErrInvalidRequest) {
				t.Errorf("%s: got %v, want %q", tc.body, err, tc.msg)
			}
			continue
		}
		if err != nil || all != tc.all || !slices.Equal(ids, tc.ids) {
			t.Errorf("%s: got %v %v %v", tc.body, ids, all, err)
		}
	}
	if notifications.MarkedReadText(2) != "Marked 2 notifications as read" {
		t.Error(notifications.MarkedReadText(2))
	}
}

func TestDecodeListNotifications(t *testing.T) {
	if since, err := notifications.DecodeListNotifications(nil); err != nil || since != nil {
		t.Fatalf("empty: %v %v", since, err)
	}
	if since, err := notifications.DecodeListNotifications([]byte(`{"since":0}`)); err != nil || since == nil || *since != 0 {
		t.Fatalf("since 0: %v %v", since, err)
	}
	for _, body := range []string{`{"since":-1}`, `{"since":1.5}`, `{"since":"3"}`, `{"from":3}`} {
		if _, err := notifications.DecodeListNotifications([]byte(body)); !errors.Is(err, subjects.ErrInvalidRequest) {
			t.Errorf("%s: %v", body, err)
		}
	}
}
