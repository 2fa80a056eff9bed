package waitfor_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/subjects/subjectstest"
	"github.com/chime-nats/chime/waitfor"
)

func TestDecodeWaitFor(t *testing.T) {
	for _, tc := range []struct {
		body string
		want waitfor.WaitForSpec
	}{
		{`{"wake":"operator_input","reason":"need approval","delivery":"final"}`,
			waitfor.WaitForSpec{Wake: waitfor.WakeOperatorInput, Reason: "need approval", Delivery: waitfor.DeliveryFinal}},
		{`{"wake":"timer","resource":"t1","reason":"r","delivery":"silent","work_item_id":"w-2","recheck_after_ms":1500}`,
			waitfor.WaitForSpec{Wake: waitfor.WakeTimer, Resource: "t1", Reason: "r", Delivery: waitfor.DeliverySilent, WorkItemID: "w-2", RecheckAfter: 1500 * time.Millisecond}},
		{`{"wake":"external","resource":"ci","reason":" spaced ","delivery":"final"}`,
			waitfor.WaitForSpec{Wake: waitfor.WakeExternal, Resource: "ci", Reason: "spaced", Delivery: waitfor.DeliveryFinal}},
		{`{"wake":"external","resource":" github:holon-run/holon#2258 ","reason":"r","delivery":"silent"}`,
			waitfor.WaitForSpec{Wake: waitfor.WakeExternal, Resource: "github:holon-run/holon#2258", Reason: "r", Delivery: waitfor.DeliverySilent}},
		{`{"wake":"monitor","resource":" mon_1 ","reason":"r","delivery":"silent"}`,
			waitfor.WaitForSpec{Wake: waitfor.WakeMonitor, Resource: "mon_1", Reason: "r", Delivery: waitfor.DeliverySilent}},
		{`{"wake":"operator_input","resource":"  ","reason":"r","delivery":"silent"}`,
			waitfor.WaitForSpec{Wake: waitfor.WakeOperatorInput, Reason: "r", Delivery: waitfor.DeliverySilent}},
	} {
		got, err := waitfor.DecodeWaitFor([]byte(tc.body))
		if err != nil {
			t.Errorf("%s: %v", tc.body, err)
			continue
		}
		if !reflect.DeepEqual(*got, tc.want) {
			t.Errorf("%s: got %+v, want %+v", tc.body, *got, tc.want)
		}
	}
}

func TestDecodeWaitForErrors(t *testing.T) {
	for _, tc := range []struct{ body, code, msg string }{
		{`{"reason":"r","delivery":"final"}`, subjects.CodeInvalidRequest, "wake is required"},
		{`{"wake":"Timer","reason":"r","delivery":"final"}`, subjects.CodeInvalidRequest, "wake must be one of operator_input, task_result, external, timer, system, monitor, not Timer"},
		{`{"wake":"timer","reason":"r","delivery":"final"}`, subjects.CodeInvalidRequest, "WaitFor wake `timer` requires non-empty `resource`"},
		{`{"wake":"timer","resource":"  ","reason":"r","delivery":"final"}`, subjects.CodeInvalidRequest, "WaitFor wake `timer` requires non-empty `resource`"},
		{`{"wake":"task_result","reason":"r","delivery":"final"}`, subjects.CodeInvalidRequest, "WaitFor wake `task_result` requires non-empty `resource`"},
		{`{"wake":"task_result","resource":"","reason":"r","delivery":"silent"}`, subjects.CodeInvalidRequest, "WaitFor wake `task_result` requires non-empty `resource`"},
		{`{"wake":"monitor","reason":"r","delivery":"silent"}`, subjects.CodeInvalidRequest, "WaitFor wake `monitor` requires non-empty `resource`"},
		{`{"wake":"monitor","resource":"mon_1*","reason":"r","delivery":"silent"}`, subjects.CodeInvalidID, `resource "mon_1*" may only contain letters, digits, '_' and '-'`},
		{`{"wake":"external","resource":"a\u0001","reason":"r","delivery":"final"}`, subjects.CodeInvalidRequest, "resource must not contain control characters"},
		{`{"wake":"timer","reason":"","delivery":"final"}`, subjects.CodeInvalidRequest, "WaitFor requires a non-empty `reason`"},
		{`{"wake":"system","reason":"  ","delivery":"final"}`, subjects.CodeInvalidRequest, "WaitFor requires a non-empty `reason`"},
		{`{"wake":"system","reason":"r"}`, subjects.CodeInvalidRequest, "delivery is required"},
		{`{"wake":"system","reason":"r","delivery":"loud"}`, subjects.CodeInvalidRequest, "delivery must be one of final, silent, not loud"},
		{`{"wake":"timer","resource":"a.b","reason":"r","delivery":"final"}`, subjects.CodeInvalidID, `resource "a.b" may only contain letters, digits, '_' and '-'`},
		{`{"wake":"system","reason":"r","delivery":"final","work_item_id":"*"}`, subjects.CodeInvalidID, `work_item_id "*" may only contain letters, digits, '_' and '-'`},
		{`{"wake":"system","reason":"r","delivery":"final","recheck_after_ms":0}`, subjects.CodeInvalidRequest, "recheck_after_ms must be a positive integer, not 0"},
		{`{"wake":"system","reason":"r","delivery":"final","recheck_after_ms":1.5}`, subjects.CodeInvalidRequest, "recheck_after_ms must be a positive integer, not 1.5"},
		{`{"wake":"system","reason":"r","delivery":"final","recheck_after_ms":2592000001}`, subjects.CodeInvalidRequest, "recheck_after_ms is too large: at most 2592000000"},
		{`{"wake":"system","reason":"r","delivery":"final","every_ms":5}`, subjects.CodeInvalidRequest, `unknown field "every_ms"`},
		{`[]`, subjects.CodeInvalidJSON, "request body must be a JSON object"},
	} {
		_, err := waitfor.DecodeWaitFor([]byte(tc.body))
		var e *subjects.Error
		if !errors.As(err, &e) || e.Code != tc.code || e.Message != tc.msg {
			t.Errorf("%s: got %v, want %s: %s", tc.body, err, tc.code, tc.msg)
		}
	}
}

func FuzzDecodeWaitFor(f *testing.F) {
	subjectstest.AddSeeds(f, `{"wake":"timer","resource":"t","reason":"r","delivery":"final"}`, `{"wake":"system"}`, `{"recheck_after_ms":-1}`,
		`{"wake":"external","resource":"ci","reason":" r ","delivery":"silent","work_item_id":"w","recheck_after_ms":1500}`)
	keys := []string{"wake", "resource", "reason", "delivery", "work_item_id", "recheck_after_ms"}
	subjectstest.Request(f, waitfor.DecodeWaitFor, keys, []string{subjects.CodeInvalidJSON, subjects.CodeInvalidRequest, subjects.CodeInvalidID}, func(t *testing.T, body []byte, spec *waitfor.WaitForSpec) {
		if spec.Reason == "" || !slices.Contains(waitfor.WakeKinds(), spec.Wake) || !slices.Contains(waitfor.Deliveries(), spec.Delivery) ||
			(spec.Wake.NeedsResource() && spec.Resource == "") || spec.RecheckAfter < 0 {
			t.Fatalf("accepted %s as %+v", body, spec)
		}
		req := map[string]any{"wake": spec.Wake, "resource": spec.Resource, "reason": spec.Reason, "delivery": spec.Delivery, "work_item_id": spec.WorkItemID}
		if spec.RecheckAfter > 0 {
			req["recheck_after_ms"] = spec.RecheckAfter.Milliseconds()
		}
		if back, err := waitfor.DecodeWaitFor(subjectstest.EncodeBody(t, req)); err != nil || !reflect.DeepEqual(*back, *spec) {
			t.Fatalf("%s accepted as %+v, which reads back as %+v (%v)", body, spec, back, err)
		}
	})
}

func TestDecodeWaitTasks(t *testing.T) {
	got, err := waitfor.DecodeWaitTasks([]byte(`{"task_ids":["t1","t2"],"mode":"all","reason":" r ","work_item_id":"w1"}`))
	want := waitfor.WaitForSpec{Wake: waitfor.WakeTaskResult, Resources: []string{"t1", "t2"}, Mode: waitfor.WaitModeAll, Reason: "r", Delivery: waitfor.DeliverySilent, WorkItemID: "w1"}
	if err != nil || !reflect.DeepEqual(*got, want) {
		t.Fatalf("got %+v (%v), want %+v", got, err, want)
	}
	if got, err := waitfor.DecodeWaitTasks([]byte(`{"task_ids":["t1"],"mode":"any","reason":"r","delivery":"final"}`)); err != nil || got.Delivery != waitfor.DeliveryFinal {
		t.Fatalf("final: %+v %v", got, err)
	}
	many := make([]string, waitfor.MaxWaitTasks+1)
	for i := range many {
		many[i] = fmt.Sprintf("t%d", i)
	}
	manyBody, _ := json.Marshal(map[string]any{"task_ids": many, "mode": "all", "reason": "r"})
	for _, tc := range []struct{ body, code, msg string }{
		{`{"task_ids":[],"mode":"all","reason":"r"}`, subjects.CodeInvalidRequest, "task_ids must not be empty"},
		{`{"mode":"all","reason":"r"}`, subjects.CodeInvalidRequest, "task_ids must not be empty"},
		{string(manyBody), subjects.CodeInvalidRequest, "task_ids must be at most 100"},
		{`{"task_ids":["t1"],"reason":"r"}`, subjects.CodeInvalidRequest, "mode must be all or any"},
		{`{"task_ids":["t1"],"mode":"some","reason":"r"}`, subjects.CodeInvalidRequest, "mode must be all or any"},
		{`{"task_ids":["t1"],"mode":"any"}`, subjects.CodeInvalidRequest, "reason is required"},
		{`{"task_ids":["t1"],"mode":"any","reason":"r","delivery":"loud"}`, subjects.CodeInvalidRequest, "delivery must be one of final, silent, not loud"},
		{`{"task_ids":["t1","t2","t1"],"mode":"all","reason":"r"}`, subjects.CodeInvalidRequest, "task_ids must not repeat t1"},
		{`{"task_ids":["t.1"],"mode":"all","reason":"r"}`, subjects.CodeInvalidID, `task_id "t.1" may only contain letters, digits, '_' and '-'`},
		{`{"task_ids":[""],"mode":"all","reason":"r"}`, subjects.CodeInvalidID, "task_id must not be empty"},
		{`{"task_ids":["t1"],"mode":"all","reason":"r","work_item_id":"*"}`, subjects.CodeInvalidID, `work_item_id "*" may only contain letters, digits, '_' and '-'`},
		{`{"task_ids":["t1"],"mode":"all","reason":"r","resource":"t1"}`, subjects.CodeInvalidRequest, `unknown field "resource"`},
		{`{"task_ids":"t1","mode":"all","reason":"r"}`, subjects.CodeInvalidRequest, ""},
	} {
		_, err := waitfor.DecodeWaitTasks([]byte(tc.body))
		var e *subjects.Error
		if !errors.As(err, &e) || e.Code != tc.code || (tc.msg != "" && e.Message != tc.msg) {
			t.Errorf("%s: got %v, want %s: %s", tc.body, err, tc.code, tc.msg)
		}
	}
}

func TestDecodeWaitReport(t *testing.T) {
	for _, tc := range []struct{ body, code, msg string }{
		{`{"wait_id":"wf_1","text":"  "}`, subjects.CodeInvalidRequest, "text must not be empty"},
		{`{"text":"done"}`, subjects.CodeInvalidID, "wait_id must not be empty"},
		{`{"wait_id":"wf_1","text":"done","x":1}`, subjects.CodeInvalidRequest, `unknown field "x"`},
	} {
		_, err := waitfor.DecodeWaitReport([]byte(tc.body))
		var e *subjects.Error
		if !errors.As(err, &e) || e.Code != tc.code || e.Message != tc.msg {
			t.Errorf("%s: got %v, want %s: %s", tc.body, err, tc.code, tc.msg)
		}
	}
	if r, err := waitfor.DecodeWaitReport([]byte(`{"wait_id":"wf_1","text":"done"}`)); err != nil || r.Text != "done" {
		t.Fatalf("%+v %v", r, err)
	}
}
