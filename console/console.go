// Package console owns the operator console: the page chime serves at /
// (HTML, CSS and JavaScript embedded in the binary, nothing to build), the
// headers it is served with (a strict Content-Security-Policy: no inline
// script, no eval, nothing from another origin), and the one policy by
// which notification details, HTML sent by agents, are sanitized before
// any page shows them.
//
// The page talks to the same HTTP API as any operator tool, with the
// operator token it asks for kept in sessionStorage and sent as a bearer
// token, also on its event streams, which it reads with fetch rather than
// EventSource (which cannot send headers), so a token never goes into a
// URL.
package console

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"regexp"
	"sync"

	"github.com/microcosm-cc/bluemonday"
)

//go:embed static
var static embed.FS

// AssetPrefix is where the page's assets are served.
const AssetPrefix = "/console/"

// CSP is the page's Content-Security-Policy: scripts, styles and
// connections from chime itself only, images also as data: URLs (the
// only images a sanitized detail keeps), no plugins, no <base>, no
// framing.
const CSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// asset is one embedded file, ready to serve.
type asset struct {
	body        []byte
	contentType string
	etag        string
}

// assets reads the embedded files once.
var assets = sync.OnceValues(func() (map[string]asset, error) {
	out := map[string]asset{}
	err := fs.WalkDir(static, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := static.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		out[path.Base(p)] = asset{body: b, contentType: mime.TypeByExtension(path.Ext(p)), etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	return out, err
})

// Register mounts the page at GET / (exactly: other paths stay the API's)
// and its assets under AssetPrefix.
func Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { serve(w, r, "index.html") })
	mux.HandleFunc("GET "+AssetPrefix+"{file}", func(w http.ResponseWriter, r *http.Request) { serve(w, r, r.PathValue("file")) })
}

// serve writes one asset with the page's security headers. Assets are
// revalidated by ETag on each load: a new chime is seen at once, and an
// unchanged one costs a 304.
func serve(w http.ResponseWriter, r *http.Request, name string) {
	all, err := assets()
	if err != nil {
		http.Error(w, fmt.Sprintf("console: %v", err), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	SecurityHeaders(h)
	a, ok := all[name]
	if !ok || name == "index.html" && r.URL.Path != "/" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	h.Set("Cache-Control", "no-cache")
	h.Set("ETag", a.etag)
	if r.Header.Get("If-None-Match") == a.etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	h.Set("Content-Type", a.contentType)
	_, _ = w.Write(a.body)
}

// SecurityHeaders sets the page's security headers on h.
func SecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY") // frame-ancestors for browsers without CSP 2
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
}

// detailPolicy is the sanitizer of notification details, an allow-list of
// its own rather than bluemonday's UGCPolicy, which keeps what lets an
// agent's HTML reach outside its box:
//   - no id or name (nor map, area, usemap, a table cell's headers): a
//     detail is inserted into the page, so id="i-text" would be found by
//     getElementById before the page's own element, and ids or names
//     become properties of window and document (DOM clobbering). Nothing
//     in a detail can name or point at an element of the page around it;
//     class is left out too, so it cannot take the page's styles.
//   - no form, input, button or other control, no frame, script, style or
//     event handler.
//   - images only as data: URLs. detail_html also goes to UIs without the
//     console's CSP (the SSE feeds, agent.<id>.notifications), where a
//     remote image would be fetched when shown: a tracking pixel, or a
//     channel out for what an agent was tricked into putting in its URL.
//   - links only to absolute http, https and mailto URLs, opened outside
//     the page with rel="nofollow noreferrer noopener": a relative link
//     would mean whatever page shows it.
//
// A policy is safe for concurrent use once built.
var detailPolicy = sync.OnceValue(func() *bluemonday.Policy {
	p := bluemonday.NewPolicy()
	p.RequireParseableURLs(true)
	p.AllowURLSchemes("http", "https", "mailto")
	p.AllowDataURIImages() // the data: scheme, for images only (below)
	p.AllowAttrs("href").Matching(linkURL).OnElements("a")
	p.RequireNoFollowOnLinks(true)
	p.RequireNoReferrerOnLinks(true)
	p.AddTargetBlankToFullyQualifiedLinks(true)
	p.AllowAttrs("cite").Matching(linkURL).OnElements("blockquote", "q", "del", "ins")
	p.AllowAttrs("src").Matching(dataURL).OnElements("img")
	p.AllowAttrs("alt").Matching(bluemonday.Paragraph).OnElements("img")
	p.AllowAttrs("height", "width").Matching(bluemonday.NumberOrPercent).OnElements("img")

	p.AllowAttrs("dir").Matching(bluemonday.Direction).Globally()
	p.AllowAttrs("lang").Matching(regexp.MustCompile(`^[a-zA-Z]{2,8}(-[a-zA-Z0-9]{1,8})*$`)).Globally()
	p.AllowAttrs("title").Matching(bluemonday.Paragraph).Globally()
	p.AllowElements("article", "aside", "figure", "figcaption", "section", "summary", "hgroup",
		"h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "br", "div", "hr", "p", "span", "wbr",
		"abbr", "acronym", "cite", "code", "dfn", "em", "kbd", "mark", "q", "s", "samp", "strong", "sub", "sup", "var",
		"b", "i", "pre", "small", "strike", "tt", "u", "bdi", "bdo", "rp", "rt", "ruby", "del", "ins")
	p.AllowAttrs("open").Matching(regexp.MustCompile(`(?i)^(|open)$`)).OnElements("details")
	p.AllowElements("details")
	p.AllowAttrs("datetime").Matching(bluemonday.ISO8601).OnElements("time", "del", "ins")
	p.AllowElements("time")
	p.AllowAttrs("value", "min", "max", "low", "high", "optimum").Matching(bluemonday.Number).OnElements("meter", "progress")
	p.AllowLists()
	p.AllowElements("table", "caption", "thead", "tbody", "tfoot", "tr", "td", "th", "col", "colgroup")
	p.AllowAttrs("colspan", "rowspan").Matching(bluemonday.Integer).OnElements("td", "th")
	p.AllowAttrs("span").Matching(bluemonday.Integer).OnElements("col", "colgroup")
	p.AllowAttrs("scope").Matching(regexp.MustCompile(`(?i)^(row|col)(group)?$`)).OnElements("th")
	return p
})

// linkURL and dataURL are what a link and an image may point at; the
// policy's URL checks (parseable, scheme, a data: URL that is an image in
// base64) apply after them.
var (
	linkURL = regexp.MustCompile(`(?i)^\s*(https?|mailto):`)
	dataURL = regexp.MustCompile(`(?i)^\s*data:image/`)
)

// SanitizeDetail returns a notification's detail, HTML as an agent sent
// it, made safe to insert into a page.
func SanitizeDetail(html string) string {
	if html == "" {
		return ""
	}
	return detailPolicy().Sanitize(html)
}
