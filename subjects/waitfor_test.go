package subjects

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"
)

func TestDecodeWaitFor(t *testing.T) {
	for _, tc := range []struct {
		body string
		want WaitForSpec
	}{
		{`{"wake":"operator_input","reason":"need approval","delivery":"final"}`,
			WaitForSpec{Wake: WakeOperatorInput, Reason: "need approval", Delivery: DeliveryFinal}},
		{`{"wake":"timer","resource":"t1","reason":"r","delivery":"silent","work_item_id":"w-2","recheck_after_ms":1500}`,
			WaitForSpec{Wake: WakeTimer, Resource: "t1", Reason: "r", Delivery: DeliverySilent, WorkItemID: "w-2", RecheckAfter: 1500 * time.Millisecond}},
		{`{"wake":"external","resource":"ci","reason":" spaced ","delivery":"final"}`,
			WaitForSpec{Wake: WakeExternal, Resource: "ci", Reason: "spaced", Delivery: DeliveryFinal}},
		{`{"wake":"external","resource":" github:holon-run/holon#2258 ","reason":"r","delivery":"silent"}`,
			WaitForSpec{Wake: WakeExternal, Resource: "github:holon-run/holon#2258", Reason: "r", Delivery: DeliverySilent}},
		{`{"wake":"operator_input","resource":"  ","reason":"r","delivery":"silent"}`,
			WaitForSpec{Wake: WakeOperatorInput, Reason: "r", Delivery: DeliverySilent}},
	} {
		got, err := DecodeWaitFor([]byte(tc.body))
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
		{`{"reason":"r","delivery":"final"}`, CodeInvalidRequest, "wake is required"},
		{`{"wake":"Timer","reason":"r","delivery":"final"}`, CodeInvalidRequest, "wake must be one of operator_input, task_result, external, timer, system, not Timer"},
		{`{"wake":"timer","reason":"r","delivery":"final"}`, CodeInvalidRequest, "WaitFor wake `timer` requires non-empty `resource`"},
		{`{"wake":"timer","resource":"  ","reason":"r","delivery":"final"}`, CodeInvalidRequest, "WaitFor wake `timer` requires non-empty `resource`"},
		{`{"wake":"task_result","reason":"r","delivery":"final"}`, CodeInvalidRequest, "WaitFor wake `task_result` requires non-empty `resource`"},
		{`{"wake":"task_result","resource":"","reason":"r","delivery":"silent"}`, CodeInvalidRequest, "WaitFor wake `task_result` requires non-empty `resource`"},
		{`{"wake":"external","resource":"a\u0001","reason":"r","delivery":"final"}`, CodeInvalidRequest, "resource must not contain control characters"},
		{`{"wake":"timer","reason":"","delivery":"final"}`, CodeInvalidRequest, "WaitFor requires a non-empty `reason`"},
		{`{"wake":"system","reason":"  ","delivery":"final"}`, CodeInvalidRequest, "WaitFor requires a non-empty `reason`"},
		{`{"wake":"system","reason":"r"}`, CodeInvalidRequest, "delivery is required"},
		{`{"wake":"system","reason":"r","delivery":"loud"}`, CodeInvalidRequest, "delivery must be one of final, silent, not loud"},
		{`{"wake":"timer","resource":"a.b","reason":"r","delivery":"final"}`, CodeInvalidID, `resource "a.b" may only contain letters, digits, '_' and '-'`},
		{`{"wake":"system","reason":"r","delivery":"final","work_item_id":"*"}`, CodeInvalidID, `work_item_id "*" may only contain letters, digits, '_' and '-'`},
		{`{"wake":"system","reason":"r","delivery":"final","recheck_after_ms":0}`, CodeInvalidRequest, "recheck_after_ms must be a positive integer, not 0"},
		{`{"wake":"system","reason":"r","delivery":"final","recheck_after_ms":1.5}`, CodeInvalidRequest, "recheck_after_ms must be a positive integer, not 1.5"},
		{`{"wake":"system","reason":"r","delivery":"final","recheck_after_ms":2592000001}`, CodeInvalidRequest, "recheck_after_ms is too large: at most 2592000000"},
		{`{"wake":"system","reason":"r","delivery":"final","every_ms":5}`, CodeInvalidRequest, `unknown field "every_ms"`},
		{`[]`, CodeInvalidJSON, "request body must be a JSON object"},
	} {
		_, err := DecodeWaitFor([]byte(tc.body))
		var e *Error
		if !errors.As(err, &e) || e.Code != tc.code || e.Message != tc.msg {
			t.Errorf("%s: got %v, want %s: %s", tc.body, err, tc.code, tc.msg)
		}
	}
}

func FuzzDecodeWaitFor(f *testing.F) {
	addSeeds(f, `{"wake":"timer","resource":"t","reason":"r","delivery":"final"}`, `{"wake":"system"}`, `{"recheck_after_ms":-1}`,
		`{"wake":"external","resource":"ci","reason":" r ","delivery":"silent","work_item_id":"w","recheck_after_ms":1500}`)
	keys := []string{"wake", "resource", "reason", "delivery", "work_item_id", "recheck_after_ms"}
	fuzzRequest(f, DecodeWaitFor, keys, []string{CodeInvalidJSON, CodeInvalidRequest, CodeInvalidID}, func(t *testing.T, body []byte, spec *WaitForSpec) {
		if spec.Reason == "" || !slices.Contains(WakeKinds(), spec.Wake) || !slices.Contains(Deliveries(), spec.Delivery) ||
			(spec.Wake.needsResource() && spec.Resource == "") || spec.RecheckAfter < 0 {
			t.Fatalf("accepted %s as %+v", body, spec)
		}
		req := map[string]any{"wake": spec.Wake, "resource": spec.Resource, "reason": spec.Reason, "delivery": spec.Delivery, "work_item_id": spec.WorkItemID}
		if spec.RecheckAfter > 0 {
			req["recheck_after_ms"] = spec.RecheckAfter.Milliseconds()
		}
		if back, err := DecodeWaitFor(encodeBody(t, req)); err != nil || !reflect.DeepEqual(*back, *spec) {
			t.Fatalf("%s accepted as %+v, which reads back as %+v (%v)", body, spec, back, err)
		}
	})
}

func TestDecodeWaitTasks(t *testing.T) {
	got, err := DecodeWaitTasks([]byte(`{"task_ids":["t1","t2"],"mode":"all","reason":" r ","work_item_id":"w1"}`))
	want := WaitForSpec{Wake: WakeTaskResult, Resources: []string{"t1", "t2"}, Mode: WaitModeAll, Reason: "r", Delivery: DeliverySilent, WorkItemID: "w1"}
	if err != nil || !reflect.DeepEqual(*got, want) {
		t.Fatalf("got %+v (%v), want %+v", got, err, want)
	}
	if got, err := DecodeWaitTasks([]byte(`{"task_ids":["t1"],"mode":"any","reason":"r","delivery":"final"}`)); err != nil || got.Delivery != DeliveryFinal {
		t.Fatalf("final: %+v %v", got, err)
	}
	many := make([]string, MaxWaitTasks+1)
	for i := range many {
		many[i] = fmt.Sprintf("t%d", i)
	}
	manyBody, _ := json.Marshal(map[string]any{"task_ids": many, "mode": "all", "reason": "r"})
	for _, tc := range []struct{ body, code, msg string }{
		{`{"task_ids":[],"mode":"all","reason":"r"}`, CodeInvalidRequest, "task_ids must not be empty"},
		{`{"mode":"all","reason":"r"}`, CodeInvalidRequest, "task_ids must not be empty"},
		{string(manyBody), CodeInvalidRequest, "task_ids must be at most 100"},
		{`{"task_ids":["t1"],"reason":"r"}`, CodeInvalidRequest, "mode must be all or any"},
		{`{"task_ids":["t1"],"mode":"some","reason":"r"}`, CodeInvalidRequest, "mode must be all or any"},
		{`{"task_ids":["t1"],"mode":"any"}`, CodeInvalidRequest, "reason is required"},
		{`{"task_ids":["t1"],"mode":"any","reason":"r","delivery":"loud"}`, CodeInvalidRequest, "delivery must be one of final, silent, not loud"},
		{`{"task_ids":["t1","t2","t1"],"mode":"all","reason":"r"}`, CodeInvalidRequest, "task_ids must not repeat t1"},
		{`{"task_ids":["t.1"],"mode":"all","reason":"r"}`, CodeInvalidID, `task_id "t.1" may only contain letters, digits, '_' and '-'`},
		{`{"task_ids":[""],"mode":"all","reason":"r"}`, CodeInvalidID, "task_id must not be empty"},
		{`{"task_ids":["t1"],"mode":"all","reason":"r","work_item_id":"*"}`, CodeInvalidID, `work_item_id "*" may only contain letters, digits, '_' and '-'`},
		{`{"task_ids":["t1"],"mode":"all","reason":"r","resource":"t1"}`, CodeInvalidRequest, `unknown field "resource"`},
		{`{"task_ids":"t1","mode":"all","reason":"r"}`, CodeInvalidRequest, ""},
	} {
		_, err := DecodeWaitTasks([]byte(tc.body))
		var e *Error
		if !errors.As(err, &e) || e.Code != tc.code || (tc.msg != "" && e.Message != tc.msg) {
			t.Errorf("%s: got %v, want %s: %s", tc.body, err, tc.code, tc.msg)
		}
	}
}

func TestDecodeWaitReport(t *testing.T) {
	for _, tc := range []struct{ body, code, msg string }{
		{`{"wait_id":"wf_1","text":"  "}`, CodeInvalidRequest, "text must not be empty"},
		{`{"text":"done"}`, CodeInvalidID, "wait_id must not be empty"},
		{`{"wait_id":"wf_1","text":"done","x":1}`, CodeInvalidRequest, `unknown field "x"`},
	} {
		_, err := DecodeWaitReport([]byte(tc.body))
		var e *Error
		if !errors.As(err, &e) || e.Code != tc.code || e.Message != tc.msg {
			t.Errorf("%s: got %v, want %s: %s", tc.body, err, tc.code, tc.msg)
		}
	}
	if r, err := DecodeWaitReport([]byte(`{"wait_id":"wf_1","text":"done"}`)); err != nil || r.Text != "done" {
		t.Fatalf("%+v %v", r, err)
	}
}
