package api_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/notifications"
	"github.com/chime-nats/chime/replica"
	"github.com/chime-nats/chime/subjects"
)

// getJSON gets path from the replica's gateway.
func getJSON(t *testing.T, base, path string, header ...string) (int, []byte) {
	t.Helper()
	return send(t, "GET", base+path, nil, header...)
}

// history reads an agent's notifications over HTTP; since < 0 asks for
// the whole history.
func history(t *testing.T, r *replica.Replica, agent string, since int64) notifications.ListNotificationsReply {
	t.Helper()
	path := "/api/agents/" + agent + "/notifications"
	if since >= 0 {
		path += "?since=" + strconv.FormatInt(since, 10)
	}
	status, body := getJSON(t, "http://"+r.HTTPAddr(), path)
	var reply notifications.ListNotificationsReply
	if status != http.StatusOK || json.Unmarshal(body, &reply) != nil {
		t.Fatalf("GET %s: %d %s", path, status, body)
	}
	return reply
}

// notify sends agent.<agent>.notify and returns the notification ID.
func notify(t *testing.T, nc *nats.Conn, agent, body string) string {
	t.Helper()
	var reply notifications.NotifyReply
	if err := subjects.DecodeReply(request(t, nc, subjects.Agent(agent, notifications.ActionNotify), body).Data, &reply); err != nil {
		t.Fatalf("notify %s: %v", body, err)
	}
	if reply.ID == "" || reply.Message != notifications.NotificationSentText {
		t.Fatalf("notify reply %+v", reply)
	}
	return reply.ID
}

func ids(items []notifications.NotificationItem) []string {
	var out []string
	for _, n := range items {
		out = append(out, n.ID)
	}
	return out
}

// TestNotificationRules: Agent Zero's rules and texts, per source, over
// NATS and HTTP.
func TestNotificationRules(t *testing.T) {
	r, nc := startChime(t)
	base := "http://" + r.HTTPAddr()
	changes, err := nc.SubscribeSync(subjects.Agent("ann", notifications.ActionNotifications))
	if err != nil {
		t.Fatal(err)
	}
	fromAgent := notify(t, nc, "ann", `{"message":"built","title":"CI","detail":"<b>green</b>"}`)
	status, body := postJSON(t, base, "/api/control/agents/ann/notifications", `{"message":"from the console","type":"success"}`)
	var created notifications.CreateNotificationReply
	if status != http.StatusOK || json.Unmarshal(body, &created) != nil || !created.Success ||
		created.Message != "Notification created successfully" || created.NotificationID == "" {
		t.Fatalf("HTTP create: %d %s", status, body)
	}
	status, body = postJSON(t, base, "/api/control/agents/ann/notifications", `{"message":"shown long","display_time":"soon","priority":20}`)
	var third notifications.CreateNotificationReply
	if status != http.StatusOK || json.Unmarshal(body, &third) != nil {
		t.Fatalf("HTTP create: %d %s", status, body)
	}
	h := history(t, r, "ann", -1)
	if h.Count != 3 || h.GUID == "" || h.Seq == 0 || !slices.Equal(ids(h.Notifications), []string{fromAgent, created.NotificationID, third.NotificationID}) {
		t.Fatalf("history (newest last): %+v", h)
	}
	for i, want := range []notifications.NotificationItem{
		{ID: fromAgent, Type: "info", Priority: 20, Title: "CI", Message: "built", Detail: "<b>green</b>", DetailHTML: "<b>green</b>", DisplayTime: 30, AgentID: "ann"},
		{ID: created.NotificationID, Type: "success", Priority: 10, Message: "from the console", DisplayTime: 3, AgentID: "ann"},
		{ID: third.NotificationID, Type: "info", Priority: 20, Message: "shown long", DisplayTime: 3, AgentID: "ann"},
	} {
		got := h.Notifications[i]
		if _, err := time.Parse(time.RFC3339Nano, got.Timestamp); err != nil || !strings.HasSuffix(got.Timestamp, "+00:00") || got.Seq == 0 {
			t.Errorf("%d: timestamp %q seq %d", i, got.Timestamp, got.Seq)
		}
		got.Timestamp, got.Seq = "", 0
		if got != want {
			t.Errorf("%d: got %+v, want %+v", i, got, want)
		}
	}
	// Every change went out on agent.ann.notifications, in the SSE shape.
	for i := range 3 {
		m, err := changes.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var c notifications.NotificationChange
		if err := json.Unmarshal(m.Data, &c); err != nil || c.Op != notifications.OpUpsert || c.AgentID != "ann" || c.GUID != h.GUID ||
			c.Notification == nil || !reflect.DeepEqual(*c.Notification, h.Notifications[i]) || c.Seq != c.Notification.Seq {
			t.Fatalf("change %d: %v %s", i, err, m.Data)
		}
	}

	// Mark-read, with Agent Zero's texts.
	mark := "/api/control/agents/ann/notifications/mark-read"
	for _, tc := range []struct {
		body   string
		status int
		want   string
	}{
		{`{}`, 400, "No notification IDs provided"},
		{`{"notification_ids":[]}`, 400, "No notification IDs provided"},
		{`{"notification_ids":null}`, 400, "No notification IDs provided"},
		{`{"notification_ids":""}`, 400, "No notification IDs provided"},
		{`{"notification_ids":"` + fromAgent + `"}`, 400, "notification_ids must be a list"},
		{`{"notification_ids":{"a":1}}`, 400, "notification_ids must be a list"},
		{`{"notification_ids":7}`, 400, "notification_ids must be a list"},
		{`{"notification_ids":["nope"," ",3]}`, 200, "Marked 0 notifications as read"},
		{`{"notification_ids":["` + fromAgent + `","` + fromAgent + `"]}`, 200, "Marked 1 notifications as read"},
		{`{"notification_ids":["` + fromAgent + `"]}`, 200, "Marked 0 notifications as read"}, // read already
		{`{"mark_all":true,"notification_ids":"ignored"}`, 200, "All notifications marked as read"},
		{`{"mark_all":"yes"}`, 400, "mark_all must be a JSON boolean, not string"},
		{`{"notification_ids":["x"],"colour":1}`, 400, `unknown field "colour"`},
	} {
		status, body := postJSON(t, base, mark, tc.body)
		if tc.status != 200 {
			if status != tc.status {
				t.Errorf("%s: status %d", tc.body, status)
			}
			assertError(t, tc.body, body, subjects.CodeInvalidRequest, tc.want)
			continue
		}
		var reply notifications.MarkReadReply
		if status != 200 || json.Unmarshal(body, &reply) != nil || !reply.Success || reply.Message != tc.want {
			t.Errorf("%s: %d %s", tc.body, status, body)
		}
		if all := strings.Contains(tc.body, "mark_all"); all != (reply.MarkedCount == nil) {
			t.Errorf("%s: marked_count %v", tc.body, reply.MarkedCount)
		}
	}
	h2 := history(t, r, "ann", -1)
	for _, n := range h2.Notifications {
		if !n.Read {
			t.Errorf("unread after mark_all: %+v", n)
		}
	}

	// The same id updates in place: fields replaced, read reset, a fresh
	// timestamp, its place kept, a higher sequence.
	time.Sleep(2 * time.Millisecond) // a timestamp that can differ
	again := notify(t, nc, "ann", `{"message":"rebuilt","id":"`+fromAgent+`","type":"warning","priority":10}`)
	h3 := history(t, r, "ann", -1)
	if again != fromAgent || !slices.Equal(ids(h3.Notifications), ids(h.Notifications)) {
		t.Fatalf("update in place moved or copied it: %s %v", again, ids(h3.Notifications))
	}
	up, old := h3.Notifications[0], h2.Notifications[0]
	if up.Message != "rebuilt" || up.Title != "" || up.Detail != "" || up.Type != "warning" || up.Priority != 10 || up.DisplayTime != 30 ||
		up.Read || up.Timestamp == old.Timestamp || up.Seq <= old.Seq || up.Seq > h3.Seq {
		t.Fatalf("updated in place: %+v (was %+v)", up, old)
	}
	// A new id of one's own choosing is a create.
	notify(t, nc, "ann", `{"message":"named","id":"deploy-1"}`)
	if h4 := history(t, r, "ann", int64(h3.Seq)); h4.Count != 1 || h4.Notifications[0].ID != "deploy-1" || h4.Cleared || len(h4.Removed) != 0 {
		t.Fatalf("since %d: %+v", h3.Seq, h4)
	}

	// Clear: a new guid; a reader from before is told to replace its list.
	status, body = postJSON(t, base, "/api/control/agents/ann/notifications/clear", ``)
	var cleared notifications.ClearReply
	if status != 200 || json.Unmarshal(body, &cleared) != nil || !cleared.Success || cleared.Message != "All notifications cleared" ||
		cleared.GUID == "" || cleared.GUID == h.GUID {
		t.Fatalf("clear: %d %s", status, body)
	}
	h5 := history(t, r, "ann", int64(h3.Seq))
	if !h5.Cleared || h5.Count != 0 || h5.GUID != cleared.GUID || len(h5.Notifications) != 0 {
		t.Fatalf("since before the clear: %+v", h5)
	}
	if h6 := history(t, r, "ann", int64(h5.Seq)); h6.Cleared || h6.Count != 0 {
		t.Fatalf("since the clear: %+v", h6)
	}
	// Another agent's notifications are its own.
	if h := history(t, r, "bob", -1); h.Count != 0 || h.GUID != "" {
		t.Fatalf("bob: %+v", h)
	}
}

// TestNotificationsNATSOperations: the history, mark-read and clear over
// NATS, as operators and agents use them.
func TestNotificationsNATSOperations(t *testing.T) {
	_, nc := startChime(t)
	id := notify(t, nc, "cat", `{"message":"m"}`)
	var list notifications.ListNotificationsReply
	if err := subjects.DecodeReply(request(t, nc, subjects.Agent("cat", notifications.ActionNotificationsList), ``).Data, &list); err != nil ||
		list.Count != 1 || list.Notifications[0].ID != id {
		t.Fatalf("list: %v %+v", err, list)
	}
	var mark notifications.MarkReadReply
	if err := subjects.DecodeReply(request(t, nc, subjects.Agent("cat", notifications.ActionNotificationsMark), `{"notification_ids":["`+id+`"]}`).Data, &mark); err != nil ||
		mark.Message != "Marked 1 notifications as read" || *mark.MarkedCount != 1 {
		t.Fatalf("mark: %v %+v", err, mark)
	}
	var cl notifications.ClearReply
	if err := subjects.DecodeReply(request(t, nc, subjects.Agent("cat", notifications.ActionNotificationsClear), `{}`).Data, &cl); err != nil || cl.Message != "All notifications cleared" {
		t.Fatalf("clear: %v %+v", err, cl)
	}
}

// TestNotificationBadInput: every surface refuses bad input with the
// right code and status, and stores nothing.
func TestNotificationBadInput(t *testing.T) {
	r, nc := startChime(t)
	base := "http://" + r.HTTPAddr()
	long := strings.Repeat("x", subjects.MaxRequestBody)
	for _, tc := range []struct {
		action, body, code, msg string
	}{
		{notifications.ActionNotify, `{"type":"Info","priority":3}`, subjects.CodeInvalidRequest, "Invalid notification type: Info"},
		{notifications.ActionNotify, `{"priority":15,"message":"m"}`, subjects.CodeInvalidRequest, "Invalid notification priority: 15"},
		{notifications.ActionNotify, `{"priority":"20","message":"m"}`, subjects.CodeInvalidRequest, "Invalid notification priority: 20"},
		{notifications.ActionNotify, `{"title":"t"}`, subjects.CodeInvalidRequest, "Message is required"},
		{notifications.ActionNotify, `{"message":"m","id":"a.b"}`, subjects.CodeInvalidID, ""},
		{notifications.ActionNotify, `{"message":"m","id":"` + strings.Repeat("i", 65) + `"}`, subjects.CodeInvalidID, ""},
		{notifications.ActionNotify, `{"message":"m","sound":"ding"}`, subjects.CodeInvalidRequest, `unknown field "sound"`},
		{notifications.ActionNotify, `{"message":["m"]}`, subjects.CodeInvalidRequest, "message must be a JSON string, not array"},
		{notifications.ActionNotify, `{"message":"` + long + `"}`, subjects.CodePayloadTooLarge, "request body larger than 64 KiB"},
		{notifications.ActionNotify, `[1]`, subjects.CodeInvalidJSON, ""},
		{notifications.ActionNotificationsList, `{"since":-1}`, subjects.CodeInvalidRequest, "since must be a sequence number (a whole number, 0 or more), not -1"},
		{notifications.ActionNotificationsList, `{"since":"5"}`, subjects.CodeInvalidRequest, ""},
		{notifications.ActionNotificationsList, `{"after":5}`, subjects.CodeInvalidRequest, `unknown field "after"`},
		{notifications.ActionNotificationsMark, `{"notification_ids":"x"}`, subjects.CodeInvalidRequest, "notification_ids must be a list"},
		{notifications.ActionNotificationsClear, `{"all":true}`, subjects.CodeInvalidRequest, `unknown field "all"`},
	} {
		msg := request(t, nc, subjects.Agent("bad", tc.action), tc.body)
		assertError(t, tc.action+" "+tc.body, msg.Data, tc.code, tc.msg)
	}
	for _, tc := range []struct {
		method, path, body string
		status             int
		code, msg          string
	}{
		{"POST", "/api/control/agents/bad/notifications", `{"type":"loud","message":"m"}`, 400, subjects.CodeInvalidRequest, "Invalid notification type: loud"},
		{"POST", "/api/control/agents/bad/notifications", `{}`, 400, subjects.CodeInvalidRequest, "Message is required"},
		{"POST", "/api/control/agents/bad/notifications", `{"message":"m","extra":1}`, 400, subjects.CodeInvalidRequest, `unknown field "extra"`},
		{"POST", "/api/control/agents/bad/notifications", `{"message":"` + long + `"}`, 413, subjects.CodePayloadTooLarge, ""},
		{"POST", "/api/control/agents/bad/notifications", `{"message":`, 400, subjects.CodeInvalidJSON, ""},
		{"POST", "/api/control/agents/b%20d/notifications", `{"message":"m"}`, 400, subjects.CodeInvalidID, ""},
		{"GET", "/api/agents/bad/notifications?since=soon", ``, 400, subjects.CodeInvalidRequest, ""},
		{"GET", "/api/agents/bad/notifications?since=-3", ``, 400, subjects.CodeInvalidRequest, "since must be a sequence number (a whole number, 0 or more), not -3"},
		{"GET", "/api/agents/bad/notifications/events?since=x", ``, 400, subjects.CodeInvalidRequest, `since (or Last-Event-ID) must be a sequence number, not "x"`},
		{"GET", "/api/agents/b.d/notifications/events", ``, 400, subjects.CodeInvalidID, ""},
		{"POST", "/api/control/agents/bad/notifications/mark-read", `{"notification_ids":[1],"mark_all":1}`, 400, subjects.CodeInvalidRequest, ""},
		{"POST", "/api/control/agents/bad/notifications/clear", `{"x":1}`, 400, subjects.CodeInvalidRequest, ""},
	} {
		var status int
		var body []byte
		if tc.method == "GET" {
			status, body = getJSON(t, base, tc.path)
		} else {
			status, body = postJSON(t, base, tc.path, tc.body)
		}
		if status != tc.status {
			t.Errorf("%s %s %.40s: status %d, want %d", tc.method, tc.path, tc.body, status, tc.status)
		}
		assertError(t, tc.method+" "+tc.path+" "+tc.body, body, tc.code, tc.msg)
	}
	if h := history(t, r, "bad", -1); h.Count != 0 {
		t.Fatalf("bad input stored %+v", h)
	}
}

// sseEvent is one event read from a stream.
type sseEvent struct {
	id     uint64
	event  string
	data   string
	change notifications.NotificationChange // data, of a notification event
}

// follow opens an SSE stream at path and returns its events; the stream
// closes when the test ends.
func follow(t *testing.T, base, path string, header ...string) <-chan sseEvent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	res, err := http.DefaultClient.Do(newRequest(t, ctx, "GET", base+path, nil, header...))
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("GET %s: %d %s", path, res.StatusCode, b)
	}
	out := make(chan sseEvent, 10000)
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-done
	})
	go func() {
		defer close(done)
		defer close(out)
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		sc.Buffer(make([]byte, 0, 1<<20), 1<<20)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.event != "" {
					out <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				ev.id, _ = strconv.ParseUint(line[4:], 10, 64)
			case strings.HasPrefix(line, "event: "):
				ev.event = line[7:]
			case strings.HasPrefix(line, "data: "):
				ev.data = line[6:]
				if ev.event != "notification" {
					break
				}
				if err := json.Unmarshal([]byte(line[6:]), &ev.change); err != nil {
					ev.event = "unreadable: " + line
				}
			}
		}
	}()
	return out
}

// nextEvent reads the stream's next event, a notification change.
func nextEvent(t *testing.T, events <-chan sseEvent) sseEvent {
	t.Helper()
	ev := nextSSE(t, events)
	if ev.event != "notification" || ev.id != ev.change.Seq {
		t.Fatalf("event %+v", ev)
	}
	return ev
}

// nextSSE reads the stream's next event.
func nextSSE(t *testing.T, events <-chan sseEvent) sseEvent {
	t.Helper()
	select {
	case ev, ok := <-events:
		if !ok {
			t.Fatal("stream ended")
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
	}
	panic("unreachable")
}

// follower is a UI's list of one agent's notifications, kept by applying
// changes in sequence order.
type follower struct {
	seq   uint64
	guid  string
	items map[string]notifications.NotificationItem
}

func (f *follower) apply(t *testing.T, c notifications.NotificationChange) {
	t.Helper()
	if c.Seq <= f.seq {
		t.Fatalf("change %d after %d: backwards", c.Seq, f.seq)
	}
	f.seq, f.guid = c.Seq, c.GUID
	switch c.Op {
	case notifications.OpUpsert:
		f.items[c.Notification.ID] = *c.Notification
	case notifications.OpRemove:
		for _, id := range c.NotificationIDs {
			delete(f.items, id)
		}
	case notifications.OpClear:
		clear(f.items)
	}
}

// poll applies a history answer since the follower's sequence.
func (f *follower) poll(t *testing.T, r *replica.Replica, agent string) notifications.ListNotificationsReply {
	t.Helper()
	h := history(t, r, agent, int64(f.seq))
	if h.Seq < f.seq {
		t.Fatalf("history seq %d below %d", h.Seq, f.seq)
	}
	if h.Cleared {
		clear(f.items)
	}
	for _, n := range h.Notifications {
		f.items[n.ID] = n
	}
	for _, id := range h.Removed {
		delete(f.items, id)
	}
	f.seq, f.guid = h.Seq, h.GUID
	return h
}

func (f *follower) same(t *testing.T, what string, h notifications.ListNotificationsReply) {
	t.Helper()
	if why := f.differs(h); why != "" {
		t.Fatalf("%s: %s", what, why)
	}
}

// differs says how the follower's list differs from h, "" if it does not.
func (f *follower) differs(h notifications.ListNotificationsReply) string {
	if len(f.items) != len(h.Notifications) {
		return fmt.Sprintf("the follower holds %d, the history %d", len(f.items), len(h.Notifications))
	}
	for _, n := range h.Notifications {
		if f.items[n.ID] != n {
			return fmt.Sprintf("follower has %+v, history %+v", f.items[n.ID], n)
		}
	}
	if f.guid != h.GUID {
		return fmt.Sprintf("guid %q, history %q", f.guid, h.GUID)
	}
	return ""
}

// catchUp applies a stream's events until the follower holds h (the
// history's seq may be a write no event shows, a compaction's).
func (f *follower) catchUp(t *testing.T, events <-chan sseEvent, h notifications.ListNotificationsReply) {
	t.Helper()
	for f.differs(h) != "" {
		f.apply(t, nextEvent(t, events).change)
	}
}

// TestNotificationEvictionFollowers: at most the limit is kept, oldest
// evicted; followers by history (close behind, and far behind) and by
// SSE (live, and replaying from a sequence) end with exactly the history
// through evictions, updates, marker compaction and a clear.
func TestNotificationEvictionFollowers(t *testing.T) {
	const limit = 4
	r, nc := startChimeWith(t, io.Discard, func(c *config.Config) { c.NotificationsMax = limit })
	base := "http://" + r.HTTPAddr()
	live := follow(t, base, "/api/agents/eve/notifications/events")
	near := &follower{items: map[string]notifications.NotificationItem{}}
	far := &follower{items: map[string]notifications.NotificationItem{}}
	mid, atMid := uint64(0), map[string]notifications.NotificationItem{}
	var sent []string
	for i := range 40 {
		sent = append(sent, notify(t, nc, "eve", fmt.Sprintf(`{"message":"n%d"}`, i)))
		if i == 0 {
			far.poll(t, r, "eve")
		}
		if i%7 == 3 { // an update in place of the oldest kept
			h := history(t, r, "eve", -1)
			notify(t, nc, "eve", `{"message":"again","id":"`+h.Notifications[0].ID+`"}`)
		}
		if i%3 == 0 {
			near.poll(t, r, "eve")
		}
		if i == 20 {
			mid, atMid = near.seq, maps.Clone(near.items)
		}
	}
	h := history(t, r, "eve", -1)
	if h.Count != limit {
		t.Fatalf("%d kept, limit %d: %v", h.Count, limit, ids(h.Notifications))
	}
	if got := ids(h.Notifications); !slices.Equal(got[1:], sent[len(sent)-limit+1:]) {
		t.Fatalf("kept %v, the newest sent %v", got, sent[len(sent)-limit:])
	}
	near.poll(t, r, "eve")
	near.same(t, "near follower", h)
	// The removal markers are compacted, in the background: the agent's
	// messages come back within bounds (the live ones, and at most twice
	// the limit of markers).
	js, _ := jetstream.New(nc)
	st, err := js.Stream(context.Background(), "KV_"+engine.NotificationsBucket)
	if err != nil {
		t.Fatal(err)
	}
	keys := 0
	testwait.Eventually(t, 5*time.Second, func() bool {
		info, err := st.Info(context.Background(), jetstream.WithSubjectFilter("$KV."+engine.NotificationsBucket+".eve.*"))
		if err != nil {
			t.Fatal(err)
		}
		keys = len(info.State.Subjects)
		return keys <= 3*limit
	}, "eve's keys (live and markers) within 3× the limit")
	// A follower from before the compacted removals is told to replace
	// its list.
	if fh := far.poll(t, r, "eve"); !fh.Cleared {
		t.Fatalf("a follower behind the compacted removals was not told to replace its list (%d keys): %+v", keys, fh)
	}
	far.same(t, "far follower", h)

	// The live stream saw every change; a stream from mid replays what
	// changed after it, then both go on live.
	sse := &follower{items: map[string]notifications.NotificationItem{}}
	sse.catchUp(t, live, h)
	replayed := follow(t, base, "/api/agents/eve/notifications/events?since="+strconv.FormatUint(mid, 10))
	last := follow(t, base, "/api/notifications/events", "Last-Event-ID", strconv.FormatUint(h.Seq, 10))
	status, _ := postJSON(t, base, "/api/control/agents/eve/notifications/clear", `{}`)
	if status != 200 {
		t.Fatalf("clear: %d", status)
	}
	after := notify(t, nc, "eve", `{"message":"after the clear"}`)
	h2 := history(t, r, "eve", -1)
	if h2.Count != 1 || h2.Notifications[0].ID != after {
		t.Fatalf("after a clear: %+v", h2)
	}
	sse.catchUp(t, live, h2)
	ev := nextEvent(t, last)
	if ev.change.Op != notifications.OpClear || ev.change.GUID != h2.GUID || ev.change.AgentID != "eve" {
		t.Fatalf("the all-agents stream from Last-Event-ID: %+v", ev)
	}
	if ev := nextEvent(t, last); ev.change.Op != notifications.OpUpsert || ev.change.Notification.ID != after {
		t.Fatalf("then %+v", ev)
	}
	// The replay from mid: a clear first (mid is behind compacted
	// removals), then the state, in order, then live.
	rf := &follower{items: atMid, seq: mid}
	rf.catchUp(t, replayed, h2)
}

// TestNotificationsReplicasAndRestart: two replicas serve the same
// history and the same SSE stream (the same ids, the same sequence),
// streams end when their replica stops, and a restart keeps everything.
func TestNotificationsReplicasAndRestart(t *testing.T) {
	dir := t.TempDir()
	a, _ := startChimeWith(t, io.Discard, func(c *config.Config) { c.DataDir, c.ReplicaID, c.NotificationsMax = dir, "a", 5 })
	b, _ := startChimeWith(t, io.Discard, func(c *config.Config) { c.NATSURL, c.ReplicaID, c.NotificationsMax = a.NATSURL(), "b", 5 })
	streams := []<-chan sseEvent{
		follow(t, "http://"+a.HTTPAddr(), "/api/notifications/events"),
		follow(t, "http://"+b.HTTPAddr(), "/api/notifications/events"),
	}
	for i := range 12 {
		on := []*replica.Replica{a, b}[i%2]
		agent := []string{"r1", "r2", "r3"}[i%3]
		if s, body := postJSON(t, "http://"+on.HTTPAddr(), "/api/control/agents/"+agent+"/notifications", fmt.Sprintf(`{"message":"m%d"}`, i)); s != 200 {
			t.Fatalf("create on %d: %d %s", i%2, s, body)
		}
	}
	if s, _ := postJSON(t, "http://"+b.HTTPAddr(), "/api/control/agents/r1/notifications/mark-read", `{"mark_all":true}`); s != 200 {
		t.Fatal(s)
	}
	before := map[string]notifications.ListNotificationsReply{}
	for _, agent := range []string{"r1", "r2", "r3"} {
		ha, hb := history(t, a, agent, -1), history(t, b, agent, -1)
		ha.Seq, hb.Seq = 0, 0 // each as of its own answer
		if !reflect.DeepEqual(ha, hb) || ha.Count != 4 {
			t.Fatalf("%s: a has %+v, b %+v", agent, ha, hb)
		}
		before[agent] = ha
	}
	last := history(t, a, "r1", -1).Seq
	var seen [2][]sseEvent
	for i, s := range streams {
		for len(seen[i]) == 0 || seen[i][len(seen[i])-1].id < last {
			seen[i] = append(seen[i], nextEvent(t, s))
		}
	}
	if !reflect.DeepEqual(seen[0], seen[1]) || len(seen[0]) < 16 {
		t.Fatalf("the streams differ or are short: %d and %d events", len(seen[0]), len(seen[1]))
	}
	b.Stop(context.Background())
	a.Stop(context.Background())
	for i, s := range streams {
		for ev := range s { // the stream ends with its replica
			t.Fatalf("stream %d: an event after its replica stopped: %+v", i, ev)
		}
	}
	c, _ := startChimeWith(t, io.Discard, func(c *config.Config) { c.DataDir, c.ReplicaID, c.NotificationsMax = dir, "a", 5 })
	for agent, want := range before {
		got := history(t, c, agent, -1)
		got.Seq = 0
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s after a restart: %+v, before %+v", agent, got, want)
		}
	}
	// And the sequence goes on from where it was.
	if f := follow(t, "http://"+c.HTTPAddr(), "/api/notifications/events?since="+strconv.FormatUint(last-1, 10)); nextEvent(t, f).id != last {
		t.Fatal("replay after a restart")
	}
}

// TestNotificationAuth: an agent reads its own history and feed; only
// operators create over HTTP, mark read, clear, and follow every agent.
func TestNotificationAuth(t *testing.T) {
	const operator = "operator-secret-token"
	h := sha256.Sum256([]byte(operator))
	file := filepath.Join(t.TempDir(), "operators")
	if err := os.WriteFile(file, []byte(hex.EncodeToString(h[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, _ := startChimeWith(t, io.Discard, func(c *config.Config) { c.OperatorTokensFile = file })
	base := "http://" + r.HTTPAddr()
	op := []string{"Authorization", "Bearer " + operator}
	status, body := post(t, base+"/api/control/agents/ann/token", "", nil, op...)
	var issued struct{ Token string }
	if status != http.StatusCreated || json.Unmarshal(body, &issued) != nil || issued.Token == "" {
		t.Fatalf("token: %d", status)
	}
	agent := []string{"Authorization", "Bearer " + issued.Token}
	if s, _ := post(t, base+"/api/control/agents/ann/notifications", "", []byte(`{"message":"m"}`), op...); s != 200 {
		t.Fatalf("operator create: %d", s)
	}
	for _, tc := range []struct {
		method, path string
		header       []string
		status       int
	}{
		{"GET", "/api/agents/ann/notifications", agent, 200},
		{"GET", "/api/agents/bob/notifications", agent, 403},
		{"GET", "/api/agents/bob/notifications/events", agent, 403},
		{"GET", "/api/notifications/events", agent, 403},
		{"GET", "/api/notifications/events", nil, 401},
		{"GET", "/api/agents/ann/notifications/events", nil, 401},
		{"POST", "/api/control/agents/ann/notifications", agent, 403},
		{"POST", "/api/control/agents/ann/notifications/mark-read", agent, 403},
		{"POST", "/api/control/agents/ann/notifications/clear", agent, 403},
	} {
		if s, body := send(t, tc.method, base+tc.path, []byte(`{"mark_all":true}`), tc.header...); s != tc.status {
			t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, s, body, tc.status)
		}
	}
	// The streams open for those allowed (the response is then a stream).
	follow(t, base, "/api/agents/ann/notifications/events?since=0", agent...)
	follow(t, base, "/api/notifications/events", op...)
}

// TestNotificationConcurrentEviction: notifies racing on two replicas
// for one agent end with exactly the limit kept, and each notification
// beyond it removed once (one remove each on the stream, never two).
func TestNotificationConcurrentEviction(t *testing.T) {
	const limit, n = 5, 60
	a, nc := startChimeWith(t, io.Discard, func(c *config.Config) { c.NotificationsMax = limit })
	b, _ := startChimeWith(t, io.Discard, func(c *config.Config) { c.NATSURL, c.ReplicaID, c.NotificationsMax = a.NATSURL(), "b", limit })
	stream := follow(t, "http://"+b.HTTPAddr(), "/api/agents/race/notifications/events")
	bases := []string{"http://" + a.HTTPAddr(), "http://" + b.HTTPAddr()}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if i%3 == 0 { // over NATS too
				_, err := nc.Request(subjects.Agent("race", notifications.ActionNotify), fmt.Appendf(nil, `{"message":"m%d"}`, i), 10*time.Second)
				if err != nil {
					t.Error(err)
				}
				return
			}
			if s, body := postJSON(t, bases[i%2], "/api/control/agents/race/notifications", fmt.Sprintf(`{"message":"m%d"}`, i)); s != 200 {
				t.Errorf("%d: %d %s", i, s, body)
			}
		})
	}
	wg.Wait()
	h := history(t, a, "race", -1)
	if h.Count != limit {
		t.Fatalf("%d kept after %d racing notifies, limit %d", h.Count, n, limit)
	}
	// A last notify marks the end: every remove of the race comes before
	// its upsert on the stream (its own eviction comes after).
	end := notify(t, nc, "race", `{"message":"end"}`)
	upserts, removes := map[string]int{}, map[string]int{}
	for upserts[end] == 0 {
		ev := nextEvent(t, stream)
		switch ev.change.Op {
		case notifications.OpUpsert:
			upserts[ev.change.Notification.ID]++
		case notifications.OpRemove:
			for _, id := range ev.change.NotificationIDs {
				removes[id]++
			}
		}
	}
	delete(upserts, end)
	if len(upserts) != n || len(removes) != n-limit {
		t.Fatalf("%d created, %d removed; want %d and %d", len(upserts), len(removes), n, n-limit)
	}
	for id, k := range removes {
		if k != 1 {
			t.Errorf("%s removed %d times", id, k)
		}
	}
	for _, kept := range h.Notifications {
		if removes[kept.ID] != 0 {
			t.Errorf("%s kept and removed", kept.ID)
		}
	}
}
