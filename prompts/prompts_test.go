package prompts_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chime-nats/chime/deliveries"
	"github.com/chime-nats/chime/monitors"
	"github.com/chime-nats/chime/notifications"
	"github.com/chime-nats/chime/prompts"
	"github.com/chime-nats/chime/questions"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waitfor"
	"github.com/chime-nats/chime/waits"
)

// arguments parses the "## Arguments" section of a tool prompt, by name.
func arguments(t *testing.T, name string) map[string]*prompts.Argument {
	t.Helper()
	list, err := prompts.Arguments(name)
	if err != nil {
		t.Fatal(err)
	}
	args := map[string]*prompts.Argument{}
	for i := range list {
		args[list[i].Name] = &list[i]
	}
	return args
}

// jsonFields lists the JSON names of the request types' fields.
func jsonFields(types ...any) []string {
	var names []string
	for _, v := range types {
		rt := reflect.TypeOf(v)
		for i := range rt.NumField() {
			name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// action is one request a prompt documents: a valid body using every
// field the action takes, and the code's decoder for it.
type action struct {
	name   string
	valid  string
	decode func([]byte) error
}

// instead names, per prompt, for a field that is one of a group of which
// one is required (a monitor's source), the other member and the value a
// body without it takes: optional there means optional given the other.
var instead = map[string]map[string][2]string{
	"monitors.md": {"command": {"subject", `"ci.>"`}, "subject": {"command", `"make"`}},
}

func strict[T any](check func(*T) error) func([]byte) error {
	return func(b []byte) error {
		var v T
		if err := subjects.DecodeStrict(b, &v); err != nil {
			return err
		}
		return check(&v)
	}
}

var now = time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)

// decodeCreateTimer is timer.create's decoder; duration_ms and cron are
// the two forms of it, one of them required (see oneOf).
func decodeCreateTimer(b []byte) error {
	_, err := timers.DecodeCreateTimer(b, timers.TimerLimits{MinInterval: time.Second})
	return err
}

// oneOf are fields documented optional of which a body must have one: a
// body with only one of them is refused without it.
var oneOf = []string{"duration_ms", "cron"}

func decodeWait(b []byte) error { _, err := waits.DecodeWaitRequest(b, now, "UTC"); return err }

var toolPrompts = []struct {
	file    string
	fields  []string // the fields the code accepts from an agent
	actions []action
}{
	{"wait.md", jsonFields(waits.WaitRequest{}), []action{
		{"", `{"seconds":5,"minutes":1,"hours":1,"days":1,"until":"2030-01-01 09:00","tz":"Asia/Tokyo","id":"w1"}`, decodeWait},
		{"", `{"seconds":5,"minutes":1,"request_id":"r1"}`, decodeWait}, // request_id goes without id
	}},
	{"notify_user.md", jsonFields(notifications.NotifyRequest{}), []action{{"", `{"message":"m","title":"t","detail":"<b>d</b>","type":"info","priority":10,"timeout":5,"display_time":5,"id":"n1","group":"g"}`,
		func(b []byte) error { _, err := notifications.DecodeNotify(b, notifications.FromAgent); return err }}}},
	{"wait_for.md", jsonFields(waitfor.WaitForRequest{}), []action{{"", `{"wake":"external","resource":"ci","reason":"r","delivery":"final","work_item_id":"w1","recheck_after_ms":500}`,
		func(b []byte) error { _, err := waitfor.DecodeWaitFor(b); return err }}}},
	// authority_class is the operator's field (HTTP), not the agent's.
	{"timers.md", without(jsonFields(timers.CreateTimerRequest{}, timers.ListTimersRequest{}, timers.TimerRef{}, timers.NotedTimerRef{}, timers.NextTimerRequest{}), "authority_class"), []action{
		{"create", `{"duration_ms":100,"interval_ms":60000,"summary":"s","request_id":"r1"}`, decodeCreateTimer},
		{"create", `{"cron":"0 9 * * 1-5","tz":"Europe/Berlin","dst_repeated":"both","dst_skipped":"skip","catchup":"all","catchup_window_ms":600000,` +
			`"jitter":0.1,"jitter_max_ms":30000,"start_at":"2027-01-01T00:00:00Z","end_at":"2028-01-01T00:00:00Z","max_fires":10,"summary":"s","request_id":"r1"}`, decodeCreateTimer},
		{"list", `{"limit":5}`, func(b []byte) error { _, err := timers.DecodeListTimers(b); return err }},
		{"get", `{"timer_id":"t1"}`, strict((*timers.TimerRef).Validate)},
		{"cancel", `{"timer_id":"t1"}`, strict((*timers.TimerRef).Validate)},
		{"pause", `{"timer_id":"t1","note":"why"}`, strict((*timers.NotedTimerRef).Validate)},
		{"resume", `{"timer_id":"t1","note":"why"}`, strict((*timers.NotedTimerRef).Validate)},
		{"next", `{"timer_id":"t1","count":3}`, strict(func(r *timers.NextTimerRequest) error { _, err := r.Validate(); return err })},
	}},
	{"wait_for_tasks.md", jsonFields(waitfor.WaitTasksRequest{}), []action{{"", `{"task_ids":["t1","t2"],"mode":"all","reason":"r","delivery":"final","work_item_id":"w1"}`,
		func(b []byte) error { _, err := waitfor.DecodeWaitTasks(b); return err }}}},
	{"wait_report.md", jsonFields(waitfor.WaitReportRequest{}), []action{{"", `{"wait_id":"w1","text":"done"}`,
		func(b []byte) error { _, err := waitfor.DecodeWaitReport(b); return err }}}},
	{"inbox.md", jsonFields(deliveries.InboxFetchRequest{}, deliveries.InboxAckRequest{}), []action{
		{"fetch", `{"max":5,"after":3,"wait_ms":100}`, func(b []byte) error { _, err := deliveries.DecodeInboxFetch(b); return err }},
		{"ack", `{"seq":4}`, func(b []byte) error { _, err := deliveries.DecodeInboxAck(b); return err }},
	}},
	// question.answer is the operator's request, not the agent's.
	{"questions.md", jsonFields(questions.AskRequest{}, questions.ListQuestionsRequest{}), []action{
		{"ask", `{"questions":[{"title":"Deploy?","options":["yes","no"]},{"title":"Why?"}]}`, decodeAsk},
		{"list", `{"all":true}`, decodeListQuestions},
	}},
	{"tasks.md", jsonFields(tasks.StartTaskRequest{}, tasks.TaskResultRequest{}, tasks.TaskRef{}, tasks.ListTasksRequest{},
		tasks.TaskOutputRequest{}, tasks.AppendOutputRequest{}), []action{
		{"start", `{"title":"build"}`, func(b []byte) error { _, err := tasks.DecodeStartTask(b); return err }},
		{"result", `{"task_id":"t1","status":"failed","output":"x","error":"boom","exit_code":2}`, decodeResult},
		{"result", `{"task_id":"t1","status":"completed","output_appended":true}`, decodeResult},
		{"get", `{"task_id":"t1"}`, func(b []byte) error { _, err := tasks.DecodeTaskRef(b); return err }},
		{"cancel", `{"task_id":"t1"}`, func(b []byte) error { _, err := tasks.DecodeTaskRef(b); return err }},
		{"list", `{"limit":5}`, func(b []byte) error { _, err := tasks.DecodeListTasks(b); return err }},
		{"output", `{"task_id":"t1","offset":10,"limit":100}`, func(b []byte) error { _, err := tasks.DecodeTaskOutput(b); return err }},
		{"append", `{"task_id":"t1","seq":0,"data":"aGk="}`, func(b []byte) error { _, err := tasks.DecodeAppendOutput(b); return err }},
	}},
	{"monitors.md", jsonFields(monitors.StartRequest{}, monitors.StopRequest{}, monitors.Ref{}, monitors.ListRequest{}), []action{
		{"start", `{"description":"CI log","command":"make test","match":"FAIL","exclude":"skip","timeout_ms":60000,"max_events":10,"idle_timeout_ms":5000}`, decodeMonitorStart},
		{"start", `{"description":"CI log","subject":"ci.>","persistent":true}`, decodeMonitorStart},
		{"stop", `{"monitor_id":"m1","exit_code":2}`, func(b []byte) error { _, err := monitors.DecodeStop(b); return err }},
		{"get", `{"monitor_id":"m1"}`, func(b []byte) error { _, err := monitors.DecodeRef(b); return err }},
		{"list", `{"limit":5}`, func(b []byte) error { _, err := monitors.DecodeList(b); return err }},
	}},
}

func decodeMonitorStart(b []byte) error { _, err := monitors.DecodeStart(b); return err }

// decodeAsk and decodeListQuestions are the question decoders in the
// shape of an action's.
func decodeAsk(b []byte) error { _, err := questions.DecodeAsk(b); return err }

func decodeListQuestions(b []byte) error { _, _, err := questions.DecodeListQuestions(b); return err }

func decodeResult(b []byte) error { _, err := tasks.DecodeTaskResult(b); return err }

func without(names []string, drop string) []string {
	return slices.DeleteFunc(names, func(n string) bool { return n == drop })
}

// TestPromptsMatchCode holds each tool prompt to the code: the same fields,
// each documented as required exactly when the decoder refuses a body
// without it, and enum values the decoder accepts.
func TestPromptsMatchCode(t *testing.T) {
	for _, p := range toolPrompts {
		t.Run(p.file, func(t *testing.T) {
			args := arguments(t, p.file)
			documented := slices.Sorted(func(yield func(string) bool) {
				for name := range args {
					if !yield(name) {
						return
					}
				}
			})
			if !slices.Equal(documented, p.fields) {
				t.Fatalf("documented fields %v, code accepts %v", documented, p.fields)
			}
			for _, a := range p.actions {
				if err := a.decode([]byte(a.valid)); err != nil {
					t.Fatalf("%s: the valid example is refused: %v", a.name, err)
				}
				body := map[string]json.RawMessage{}
				if err := json.Unmarshal([]byte(a.valid), &body); err != nil {
					t.Fatal(err)
				}
				for name, doc := range args {
					if _, used := body[name]; !used {
						continue
					}
					if !doc.Applies(a.name) {
						t.Errorf("%s: field %s is used but documented only for %v", a.name, name, doc.For)
					}
					without := marshal(t, body, name, nil)
					if alt, ok := instead[p.file][name]; ok {
						b := map[string]json.RawMessage{}
						if err := json.Unmarshal(without, &b); err != nil {
							t.Fatal(err)
						}
						without = marshal(t, b, alt[0], json.RawMessage(alt[1]))
					}
					err := a.decode(without)
					if doc.Required && err == nil {
						t.Errorf("%s: %s is documented as required, but a body without it is accepted", a.name, name)
					}
					if !doc.Required && err != nil && !(slices.Contains(oneOf, name) && onlyOneOf(body)) {
						t.Errorf("%s: %s is documented as optional, but a body without it is refused: %v", a.name, name, err)
					}
				}
			}
			for name, doc := range args {
				if doc.Values != nil {
					checkValues(t, p.actions[0], name, doc.Values)
				}
			}
		})
	}
}

// onlyOneOf reports whether body has exactly one of the oneOf fields.
func onlyOneOf(body map[string]json.RawMessage) bool {
	n := 0
	for _, f := range oneOf {
		if _, ok := body[f]; ok {
			n++
		}
	}
	return n == 1
}

// marshal re-encodes body without the field drop, or with it set to value.
func marshal(t *testing.T, body map[string]json.RawMessage, field string, value json.RawMessage) []byte {
	t.Helper()
	out := map[string]json.RawMessage{}
	for k, v := range body {
		out[k] = v
	}
	delete(out, field)
	if value != nil {
		out[field] = value
	}
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkValues requires the documented values to be exactly the code's
// list, and each to be accepted in an otherwise valid body.
func checkValues(t *testing.T, a action, field string, values []string) {
	t.Helper()
	code := map[string][]string{
		"type":     strs(notifications.NotificationTypes()),
		"wake":     strs(waitfor.WakeKinds()),
		"delivery": strs(waitfor.Deliveries()),
		"mode":     {waitfor.WaitModeAll, waitfor.WaitModeAny},
	}[field]
	if !slices.Equal(values, code) {
		t.Errorf("%s values: documented %v, code accepts %v", field, values, code)
	}
	body := map[string]json.RawMessage{}
	_ = json.Unmarshal([]byte(a.valid), &body)
	for _, v := range values {
		q, _ := json.Marshal(v)
		if err := a.decode(marshal(t, body, field, q)); err != nil {
			t.Errorf("%s %q is documented but refused: %v", field, v, err)
		}
	}
}

func strs[T ~string](vs []T) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = string(v)
	}
	return out
}

var priorityValue = regexp.MustCompile(`(\d+) ([a-z]+) urgency`)

// TestNotifyPriorities checks notify_user's priority line: each number the
// code's, named by the code's level, and the default it states for an
// omitted priority the one agents get.
func TestNotifyPriorities(t *testing.T) {
	line := arguments(t, "notify_user.md")["priority"].Priority
	if line != "20 high urgency, 10 normal urgency; omit for high" {
		t.Errorf("priority line %q", line)
	}
	names := map[string]notifications.NotificationPriority{}
	var documented []notifications.NotificationPriority
	for _, m := range priorityValue.FindAllStringSubmatch(line, -1) {
		n, _ := strconv.Atoi(m[1])
		documented = append(documented, notifications.NotificationPriority(n))
		names[m[2]] = notifications.NotificationPriority(n)
	}
	if !slices.Equal(documented, notifications.NotificationPriorities()) {
		t.Errorf("documented priorities %v, code accepts %v", documented, notifications.NotificationPriorities())
	}
	if names["high"] != notifications.PriorityHigh || names["normal"] != notifications.PriorityNormal {
		t.Errorf("priority names %v", names)
	}
	_, omitted, _ := strings.Cut(line, "omit for ")
	n, err := notifications.DecodeNotify([]byte(`{"message":"m"}`), notifications.FromAgent)
	if err != nil || n.Priority != names[omitted] {
		t.Errorf("an omitted priority is %v (%v), the prompt says %s", n, err, omitted)
	}
}

func TestFrameworkMessages(t *testing.T) {
	got, err := prompts.Render("fw.notification_sent.md", nil)
	if err != nil || got != notifications.NotificationSentText {
		t.Errorf("notification sent: %q, %v; the reply says %q", got, err, notifications.NotificationSentText)
	}
	got, err = prompts.Render("fw.wait_complete.md", map[string]string{"target_time": "2026-12-03T09:00:00+00:00"})
	if err != nil || got != "Wait complete. Reached 2026-12-03T09:00:00+00:00." {
		t.Errorf("wait complete: %q, %v", got, err)
	}
	if _, err := prompts.Render("fw.wait_complete.md", nil); !errors.Is(err, prompts.ErrMissingVar) {
		t.Errorf("missing target_time: %v", err)
	}
	if _, err := prompts.Get("nope.md"); !errors.Is(err, prompts.ErrUnknownPrompt) {
		t.Errorf("unknown prompt: %v", err)
	}
}

func ExampleRender() {
	text, err := prompts.Render("fw.wait_complete.md", map[string]string{"target_time": "2026-12-03T09:00:00+09:00"})
	if err != nil {
		panic(err)
	}
	fmt.Println(text)
	// Output: Wait complete. Reached 2026-12-03T09:00:00+09:00.
}
