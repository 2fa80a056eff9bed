package api_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/deliveries"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
	"github.com/chime-nats/chime/waits"
)

// get sends a GET and returns the status and body.
func get(t *testing.T, url string, header ...string) (int, []byte) {
	t.Helper()
	return send(t, "GET", url, nil, header...)
}

// TestConsoleRoutes: the routes the console reads and acts through, each
// against the real replica: agents, recent deliveries and their live feed,
// waits (managed and WaitFor), an intervention ending a wait, tasks.
func TestConsoleRoutes(t *testing.T) {
	r, nc := startChime(t)
	base := "http://" + r.HTTPAddr()
	ctx := context.Background()
	c, _ := client.New(nc, "con")
	if _, err := c.CreateTimer(ctx, 20, 0, "first"); err != nil {
		t.Fatal(err)
	}
	var page deliveries.Page
	testwait.Eventually(t, 5*time.Second, func() bool {
		status, body := get(t, base+"/api/agents/con/inbox?limit=5")
		return status == 200 && json.Unmarshal(body, &page) == nil && len(page.Deliveries) == 1
	})
	var env subjects.Envelope
	if err := json.Unmarshal(page.Deliveries[0].Envelope, &env); err != nil || env.Kind != subjects.KindTimerFired || env.Text != "first" ||
		page.LastSeq < page.Deliveries[0].Seq {
		t.Fatalf("delivery: %v %+v, page %+v", err, env, page)
	}

	request(t, nc, "agent.noted.notify", `{"message":"only notifications know me"}`)
	status, body := get(t, base+"/api/agents")
	var fleet agents.ListAgentsReply
	if status != 200 || json.Unmarshal(body, &fleet) != nil || len(fleet.Agents) != 2 ||
		fleet.Agents[0] != (agents.AgentSummary{AgentID: "con", Deliveries: 1}) ||
		fleet.Agents[1] != (agents.AgentSummary{AgentID: "noted", Notifications: 1, Unread: 1}) {
		t.Fatalf("agents: %d %s", status, body)
	}

	events := follow(t, base, "/api/agents/con/inbox/events?since="+strconv.FormatUint(page.LastSeq, 10))
	var wait waits.WaitReply
	if err := json.Unmarshal(request(t, nc, "agent.con.wait.request", `{"seconds":600}`).Data, &wait); err != nil || wait.WaitID == "" {
		t.Fatalf("wait: %v %+v", err, wait)
	}
	var listed waits.ListWaitsReply
	status, body = get(t, base+"/api/agents/con/waits")
	if status != 200 || json.Unmarshal(body, &listed) != nil || len(listed.Waits) != 1 || listed.Waits[0].ID != wait.WaitID ||
		listed.Waits[0].Status != waits.WaitWaiting || listed.WaitFor == nil {
		t.Fatalf("waits: %d %s", status, body)
	}
	status, body = post(t, base+"/api/control/agents/con/intervention", "application/json", []byte(`{"action":"message","text":"look at the build"}`))
	if status != 200 {
		t.Fatalf("intervention: %d %s", status, body)
	}
	kinds := map[string]bool{}
	for !kinds[subjects.KindWaitCancelled] || !kinds[subjects.KindIntervention] {
		ev := nextSSE(t, events)
		var d deliveries.Delivery
		if ev.event != "delivery" || json.Unmarshal([]byte(ev.data), &d) != nil || ev.id != d.Seq || d.Seq <= page.LastSeq {
			t.Fatalf("event: %+v", ev)
		}
		if err := json.Unmarshal(d.Envelope, &env); err != nil {
			t.Fatal(err)
		}
		kinds[env.Kind] = true
	}
	testwait.Eventually(t, 5*time.Second, func() bool {
		list, err := c.ListWaits(ctx, 1)
		return err == nil && len(list.Waits) == 1 && list.Waits[0].Status == waits.WaitCancelled
	})

	task := request(t, nc, "agent.con.task.start", `{"task_id":"build-1","title":"build"}`)
	if strings.Contains(string(task.Data), `"error"`) {
		t.Fatalf("task start: %s", task.Data)
	}
	request(t, nc, "agent.con.task.result", `{"task_id":"build-1","status":"completed","output":"all green","exit_code":0}`)
	var taskList tasks.ListTasksReply
	status, body = get(t, base+"/api/agents/con/tasks?limit=5")
	if status != 200 || json.Unmarshal(body, &taskList) != nil || len(taskList.Tasks) != 1 || taskList.Tasks[0].ID != "build-1" {
		t.Fatalf("tasks: %d %s", status, body)
	}
	var one tasks.Task
	if status, body = get(t, base+"/api/agents/con/tasks/build-1"); status != 200 || json.Unmarshal(body, &one) != nil || one.Status != tasks.TaskCompleted {
		t.Fatalf("task: %d %s", status, body)
	}
	var out tasks.TaskOutputReply
	if status, body = get(t, base+"/api/agents/con/tasks/build-1/output?offset=4"); status != 200 || json.Unmarshal(body, &out) != nil ||
		string(out.Data) != "green" || !out.EOF {
		t.Fatalf("task output: %d %s", status, body)
	}
}

// TestConsoleRoutesBadInput: each route names what is wrong, with the
// status and JSON error of the rest of the API.
func TestConsoleRoutesBadInput(t *testing.T) {
	r, _ := startChime(t)
	base := "http://" + r.HTTPAddr()
	for _, tc := range []struct {
		method, path, body string
		status             int
		code, msg          string
	}{
		{"GET", "/api/agents/bad.id/inbox", "", 400, subjects.CodeInvalidID, "agent_id"},
		{"GET", "/api/agents/a/inbox?limit=0", "", 400, subjects.CodeInvalidRequest, "limit"},
		{"GET", "/api/agents/a/inbox?limit=x", "", 400, subjects.CodeInvalidRequest, "limit"},
		{"GET", "/api/agents/a/inbox?source=", "", 400, subjects.CodeInvalidRequest, `source must be TYPE:ID (a monitor's: monitor:<monitor_id>), not "": no ':'`},
		{"GET", "/api/agents/a/inbox?source=mon_1", "", 400, subjects.CodeInvalidRequest, "no ':'"},
		{"GET", "/api/agents/a/inbox?source=Monitor:mon_1", "", 400, subjects.CodeInvalidRequest, "the type is 1-32 of a-z and '_'"},
		{"GET", "/api/agents/a/inbox?source=:mon_1", "", 400, subjects.CodeInvalidRequest, "the type is 1-32"},
		{"GET", "/api/agents/a/inbox?source=" + strings.Repeat("m", 33) + ":x", "", 400, subjects.CodeInvalidRequest, "the type is 1-32"},
		{"GET", "/api/agents/a/inbox?source=monitor:", "", 400, subjects.CodeInvalidRequest, "the id must not be empty"},
		{"GET", "/api/agents/a/inbox?source=monitor:a.b", "", 400, subjects.CodeInvalidRequest, "may only contain letters"},
		{"GET", "/api/agents/a/inbox?source=monitor:" + strings.Repeat("x", 65), "", 400, subjects.CodeInvalidRequest, "at most 64"},
		{"GET", "/api/agents/a/inbox?source=monitor:m1&source=monitor:m2", "", 400, subjects.CodeInvalidRequest, "give it once"},
		{"GET", "/api/agents/a/inbox?source=monitor:m1&limit=1001", "", 400, subjects.CodeInvalidRequest, "limit"},
		{"GET", "/api/agents/a/inbox/events?since=-1", "", 400, subjects.CodeInvalidRequest, `since (or Last-Event-ID) must be a sequence number, not "-1"`},
		{"GET", "/api/agents/bad.id/inbox/events", "", 400, subjects.CodeInvalidID, "agent_id"},
		{"GET", "/api/agents/a/waits?limit=1001", "", 400, subjects.CodeInvalidRequest, "limit"},
		{"GET", "/api/agents/a/tasks?limit=-3", "", 400, subjects.CodeInvalidRequest, "limit"},
		{"GET", "/api/agents/a/tasks/nope", "", 404, tasks.CodeTaskNotFound, "nope"},
		{"GET", "/api/agents/a/tasks/nope/output?offset=x", "", 400, subjects.CodeInvalidRequest, "offset"},
		{"POST", "/api/control/agents/a/intervention", `{"action":"dance"}`, 400, subjects.CodeInvalidRequest, "action"},
		{"POST", "/api/control/agents/a/intervention", `{"action":"message","extra":1}`, 400, subjects.CodeInvalidRequest, "extra"},
		{"GET", "/api/agents/a/nothing-here", "", 404, "not_found", "no route for GET /api/agents/a/nothing-here"},
	} {
		var status int
		var body []byte
		if tc.method == "GET" {
			status, body = get(t, base+tc.path)
		} else {
			status, body = post(t, base+tc.path, "application/json", []byte(tc.body))
		}
		var e struct{ Error subjects.Error }
		if status != tc.status || json.Unmarshal(body, &e) != nil || e.Error.Code != tc.code || !strings.Contains(e.Error.Message, tc.msg) {
			t.Errorf("%s %s %s: %d %s, want %d %s containing %q", tc.method, tc.path, tc.body, status, body, tc.status, tc.code, tc.msg)
		}
	}
}

// TestInboxEventsEndWithTheGateway: an open feed ends when the replica
// stops, so a stream never holds the shutdown (Stop would block here).
func TestInboxEventsEndWithTheGateway(t *testing.T) {
	r, _ := startChime(t)
	events := follow(t, "http://"+r.HTTPAddr(), "/api/agents/quiet/inbox/events")
	r.Stop(context.Background())
	for range events {
	}
}

// TestConsoleRoutesGuarded: with operator tokens, the agent list is
// operators' only; an agent reads its own recent deliveries, live feed,
// waits and tasks, and no one else's.
func TestConsoleRoutesGuarded(t *testing.T) {
	base, _, op, agent := startGuarded(t, "guarded")
	for _, tc := range []struct {
		path, auth string
		status     int
	}{
		{"/api/agents", "", 401},
		{"/api/agents", agent, 403},
		{"/api/agents", op, 200},
		{"/api/agents/guarded/inbox", "", 401},
		{"/api/agents/guarded/inbox", agent, 200},
		{"/api/agents/other/inbox", agent, 403},
		{"/api/agents/guarded/waits", agent, 200},
		{"/api/agents/guarded/tasks", agent, 200},
		{"/api/agents/guarded/inbox/events", agent, 200},
		{"/api/agents/other/inbox/events", agent, 403},
		{"/api/agents/guarded/inbox/events", "", 401},
		{"/", "", 200}, // the page itself asks for the token
	} {
		if tc.status == 200 && strings.HasSuffix(tc.path, "/events") {
			continue
		}
		if status, body := get(t, base+tc.path, "Authorization", tc.auth); status != tc.status {
			t.Errorf("GET %s as %q: %d %s, want %d", tc.path, strings.SplitN(tc.auth, " ", 2)[0], status, body, tc.status)
		}
	}
	follow(t, base, "/api/agents/guarded/inbox/events", "Authorization", op) // 200, or it fails
	follow(t, base, "/api/agents/guarded/inbox/events", "Authorization", agent)
	if status, body := post(t, base+"/api/control/agents/guarded/intervention", "application/json", []byte(`{"action":"pause"}`), "Authorization", agent); status != 403 {
		t.Errorf("an agent's intervention: %d %s", status, body)
	}
}
