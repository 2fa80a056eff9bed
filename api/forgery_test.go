package api_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/chime-nats/chime/callbacks"
)

// TestBrowserForgeryRefused: without operator tokens the API is open to
// loopback, so what a browser may be made to send matters. A request
// naming another host (a DNS-rebound page) and an unsafe cross-site
// request (a form or fetch from another site) are refused with 403 and
// change nothing; the same requests from the page's own origin pass, and
// callbacks, which other sites call, pass whatever their origin.
func TestBrowserForgeryRefused(t *testing.T) {
	r, nc := startChime(t)
	base := "http://" + r.HTTPAddr()
	urls := startAgent(t, nc, "web")
	send := func(method, url, host string, headers map[string]string, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if host != "" {
			req.Host = host
		}
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		got, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(got)
	}
	crossSite := map[string]string{"Origin": "http://attacker.example", "Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"}
	sameOrigin := map[string]string{"Origin": base, "Sec-Fetch-Site": "same-origin", "Content-Type": "application/json"}
	create := `{"duration_ms":600000,"summary":"forged"}`

	for _, c := range []struct {
		name, method, path, host string
		headers                  map[string]string
		want                     int
		msg                      string
	}{
		{"rebound read", "GET", "/api/agents/web/timers", "attacker.example:8080", nil, 403, `not \"attacker.example:8080\"`},
		{"rebound token", "POST", "/api/control/agents/web/token", "attacker.example", nil, 403, "loopback host"},
		{"cross-site create", "POST", "/api/control/agents/web/timers", "", crossSite, 403, "cross-origin POST"},
		{"cross-site clear", "POST", "/api/control/agents/web/notifications/clear", "", crossSite, 403, "cross-origin POST"},
		{"localhost", "GET", "/api/agents/web/timers", "localhost:1", nil, 200, ""},
		{"same origin", "POST", "/api/control/agents/web/timers", "", sameOrigin, 201, ""},
	} {
		status, body := send(c.method, base+c.path, c.host, c.headers, create)
		if status != c.want || !strings.Contains(body, c.msg) {
			t.Errorf("%s: %d %s, want %d with %q", c.name, status, body, c.want, c.msg)
		}
	}
	// Only the same-origin create made a timer.
	list := request(t, nc, "agent.web.timer.list", `{}`)
	if n := strings.Count(string(list.Data), `"id":"tmr_`); n != 1 {
		t.Errorf("%d timers after one allowed create: %s", n, list.Data)
	}
	// A callback from another site is no forgery: its URL is its authority.
	status, body := send("POST", urls[callbacks.ModeEnqueueMessage], "", crossSite, "the build passed")
	if status != 200 {
		t.Errorf("cross-site callback: %d %s", status, body)
	}
}
