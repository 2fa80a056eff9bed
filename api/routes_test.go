package api_test

import (
	"strings"
	"testing"
)

// TestHTTPWriteRoutes: the task, wait, WaitFor and ask actions are served
// over HTTP from their declarations, a path's ID going into the body; a
// body that names that ID itself is refused, as is any bad body, in the
// same words as over NATS.
func TestHTTPWriteRoutes(t *testing.T) {
	r, _ := startChime(t)
	base := "http://" + r.HTTPAddr() + "/api/control/agents/hw"
	for _, c := range []struct {
		name, path, body string
		status           int
		want             string
	}{
		{"task start", "/tasks", `{"task_id":"t1","title":"build"}`, 201, `"status":"running"`},
		{"wait for the task", "/wait-tasks", `{"task_ids":["t1"],"mode":"all","reason":"the build"}`, 200, `"disposition":"registered"`},
		{"task output", "/tasks/t1/output", `{"seq":0,"data":"aGk="}`, 200, ``},
		{"task output out of order", "/tasks/t1/output", `{"seq":5,"data":"aGk="}`, 409, `"task_output_out_of_order"`},
		{"result naming its task twice", "/tasks/t1/result", `{"task_id":"t2","status":"completed"}`, 400, `"invalid_json"`},
		{"result not an object", "/tasks/t1/result", `[1]`, 400, `"invalid_json"`},
		{"task result", "/tasks/t1/result", `{"status":"completed","output":"ok"}`, 200, `"status":"completed"`},
		{"cancel of a finished task", "/tasks/t1/cancel", ``, 200, `"status":"completed"`},
		{"managed wait", "/waits", `{"id":"w1","seconds":600}`, 201, `"wait_id":"w1"`},
		{"wait cancel", "/waits/w1/cancel", ``, 200, `"status":"cancelled"`},
		{"wait cancel unknown", "/waits/nope/cancel", ``, 404, `"wait_not_found"`},
		{"WaitFor", "/wait-for", `{"wake":"operator_input","reason":"a word","delivery":"final"}`, 200, `"awaiting_final_report"`},
		{"WaitFor bad", "/wait-for", `{"wake":"soon","reason":"x","delivery":"silent"}`, 400, `wake must be one of`},
		{"system wake", "/wake", `{"text":"look"}`, 200, ``},
		{"ask", "/questions", `{"questions":[{"title":"Ship it?","options":["yes","no"]}]}`, 201, `"accepted":true`},
	} {
		status, body := postJSON(t, base, c.path, c.body)
		if status != c.status || !strings.Contains(string(body), c.want) {
			t.Errorf("%s: POST %s: %d %s, want %d with %s", c.name, c.path, status, body, c.status, c.want)
		}
	}
}
