package action_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/chime-nats/chime/action"
)

func ok(context.Context, action.Request) (any, error) { return nil, nil }

func TestNewTableRefusesBadDeclarations(t *testing.T) {
	good := action.Action{Name: "thing.do", Access: action.Agent, Summary: "s", Handle: ok}
	for name, bad := range map[string]action.Action{
		"empty name":     {Access: action.Agent, Handle: ok},
		"wildcard":       {Name: "thing.>", Access: action.Agent, Handle: ok},
		"leading dot":    {Name: ".thing", Access: action.Agent, Handle: ok},
		"no access":      {Name: "thing.x", Handle: ok},
		"no handler":     {Name: "thing.x", Access: action.Agent},
		"HTTP no route":  {Name: "thing.x", Access: action.Agent, Handle: ok, HTTPOnly: true},
		"route no agent": {Name: "thing.x", Access: action.Agent, Handle: ok, HTTP: &action.Route{Method: "GET", Path: "/api/things"}},
	} {
		if _, err := action.NewTable([]action.Action{good, bad}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := action.NewTable([]action.Action{good}, []action.Action{good}); !errors.Is(err, action.ErrDuplicate) {
		t.Errorf("a name declared twice: %v", err)
	}
}

func TestTableNamesAndLimits(t *testing.T) {
	tb, err := action.NewTable([]action.Action{
		{Name: "a.read", Access: action.Agent, Handle: ok, Body: "{x?}", Reply: "a record"},
		{Name: "a.admin", Access: action.Operator, Handle: ok, MaxBody: func() int64 { return 7 }},
		{Name: "a.form", Access: action.Operator, Handle: ok, HTTPOnly: true, HTTP: &action.Route{Method: "POST", Path: "/api/control/agents/{id}/form", Status: 201}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(tb.Names(action.Agent), ","); got != "a.read" {
		t.Errorf("agent names %q", got)
	}
	if got := strings.Join(tb.Names(action.Operator), ","); got != "a.read,a.admin" {
		t.Errorf("operator names %q (HTTP-only actions are no NATS right)", got)
	}
	read, _ := tb.Lookup("a.read")
	admin, _ := tb.Lookup("a.admin")
	if read.Limit() != action.DefaultMaxBody || admin.Limit() != 7 {
		t.Errorf("limits %d %d", read.Limit(), admin.Limit())
	}
	if _, found := tb.Lookup("a.nope"); found {
		t.Error("found an action never declared")
	}
	md := tb.Markdown()
	for _, want := range []string{"| `a.read` | agent | `{x?}` | a record | - |", "| (HTTP only) | operator |  |  | `POST /api/control/agents/{id}/form` (201) |"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

func TestRouteBodies(t *testing.T) {
	mux := http.NewServeMux()
	var got string
	mux.HandleFunc("GET /x/{id}/{item}", func(w http.ResponseWriter, r *http.Request) {
		got = string(action.Path(map[string]string{"item_id": "item"}, "limit", "n")(r, nil))
	})
	for _, c := range []struct{ url, want string }{
		{"/x/a/i1?limit=5", `{"item_id":"i1","limit":5}`},
		{"/x/a/i1?limit=abc", `{"item_id":"i1","limit":"abc"}`},
		{"/x/a/i1?limit=-", `{"item_id":"i1","limit":"-"}`}, // not a number: a string, refused as one
		{"/x/a/i1?limit=1.2.3", `{"item_id":"i1","limit":"1.2.3"}`},
		{"/x/a/i1", `{"item_id":"i1"}`},
	} {
		mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", c.url, nil))
		if got != c.want {
			t.Errorf("%s: %s, want %s", c.url, got, c.want)
		}
	}
	r := httptest.NewRequest("GET", "/?cursor=12&limit=3", nil)
	if got := string(action.List(r, nil)); got != `{"cursor":"12","limit":3}` {
		t.Errorf("list: %s", got)
	}
	if got := action.Query("since")(httptest.NewRequest("GET", "/", nil), nil); got != nil {
		t.Errorf("no parameters: %s, want no body", got)
	}
}
