package console_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/chime-nats/chime/console"
)

func TestSanitizeDetail(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{`<b>ok</b>`, `<b>ok</b>`},
		{`<img src=x onerror="alert(1)">`, ``},
		{`<script>alert(1)</script>text`, `text`},
		{`<a href="javascript:alert(1)">x</a>`, `x`},
		{`<a href="https://ci.example/1">log</a>`, `<a href="https://ci.example/1" rel="nofollow noreferrer noopener" target="_blank">log</a>`},
		{`<p style="position:fixed" onclick="x()">p</p>`, `<p>p</p>`},
		{`<iframe src="https://evil.example"></iframe><form action="/x"><input></form>`, ``},
		// Nothing can name or point at the page's elements (getElementById,
		// window.<id>, document.<name>), nor take its styles.
		{`<p id="i-text">x</p><a id="q-list" name="q-list">q</a>`, `<p>x</p>q`},
		{`<form name="sign-out"><input name="x" form="i-form"><button formaction="/x">b</button></form>`, `b`},
		{`<map name="m"><area href="https://x.example"></map><img usemap="#m" src="data:image/png;base64,iVBORw0KGgo=">`,
			`<img src="data:image/png;base64,iVBORw0KGgo=">`},
		{`<table><tr><th scope="col" id="h">h</th><td headers="i-text" colspan="2" class="toast">c</td></tr></table>`,
			`<table><tr><th scope="col">h</th><td colspan="2">c</td></tr></table>`},
		{`<p class="badge" data-id="x" aria-controls="q-list" lang="en-GB" title="t">p</p>`, `<p lang="en-GB" title="t">p</p>`},
		// Images only as data: URLs: a remote one would be fetched by any UI
		// that shows it.
		{`<img src="https://track.example/p.gif?d=secret" alt="chart">`, `<img alt="chart">`},
		{`<img src="data:image/png;base64,iVBORw0KGgo=" alt="chart">`, `<img src="data:image/png;base64,iVBORw0KGgo=" alt="chart">`},
		{`<img src="data:text/html;base64,PHNjcmlwdD4=">`, ``},
		// Links only to absolute http(s) and mailto URLs.
		{`<a href="/api/control/agents/x">rel</a><a href="data:image/png;base64,iVBORw0KGgo=">d</a><a href="mailto:ops@example.com">m</a>`,
			`reld<a href="mailto:ops@example.com" rel="nofollow noreferrer">m</a>`},
		{`<details open><summary>more</summary><blockquote cite="javascript:x()">q</blockquote></details>`,
			`<details open=""><summary>more</summary><blockquote>q</blockquote></details>`},
	} {
		if got := console.SanitizeDetail(tc.in); got != tc.want {
			t.Errorf("SanitizeDetail(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestServe(t *testing.T) {
	mux := http.NewServeMux()
	console.Register(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, tc := range []struct {
		path, contentType string
		status            int
	}{
		{"/", "text/html; charset=utf-8", 200},
		{"/console/app.js", "text/javascript; charset=utf-8", 200},
		{"/console/app.css", "text/css; charset=utf-8", 200},
		{"/console/index.html", "", 404},
		{"/console/nothing.js", "", 404},
		{"/elsewhere", "", http.StatusTeapot}, // other paths stay the API's
	} {
		res, err := http.Get(srv.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != tc.status || tc.contentType != "" && res.Header.Get("Content-Type") != tc.contentType {
			t.Errorf("GET %s: %d %s", tc.path, res.StatusCode, res.Header.Get("Content-Type"))
		}
		if tc.status == 200 {
			if res.Header.Get("Content-Security-Policy") != console.CSP || res.Header.Get("X-Content-Type-Options") != "nosniff" ||
				res.Header.Get("Referrer-Policy") != "no-referrer" || len(body) == 0 {
				t.Errorf("GET %s headers: %v", tc.path, res.Header)
			}
			req, _ := http.NewRequest("GET", srv.URL+tc.path, nil)
			req.Header.Set("If-None-Match", res.Header.Get("ETag"))
			again, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			again.Body.Close()
			if again.StatusCode != http.StatusNotModified {
				t.Errorf("GET %s again: %d", tc.path, again.StatusCode)
			}
		}
	}
	// The page runs no inline script: every script is a file of its own.
	res, _ := http.Get(srv.URL + "/")
	page, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if strings.Count(string(page), "<script") != 1 || !strings.Contains(string(page), `<script src="/console/app.js" defer></script>`) {
		t.Errorf("scripts in the page: %s", page)
	}
	// The script writes what the API sends as text: HTML goes into the
	// page in one place only, the notification detail the server sanitized
	// (a monitor's lines, external text, are never HTML).
	res, _ = http.Get(srv.URL + "/console/app.js")
	script, _ := io.ReadAll(res.Body)
	res.Body.Close()
	html := 0
	for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "createContextualFragment", "DOMParser"} {
		html += strings.Count(string(script), sink)
	}
	if html != 1 || !strings.Contains(string(script), "d.innerHTML = n.detail_html;") {
		t.Errorf("%d places where app.js writes HTML, want the one for detail_html", html)
	}
}
