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
	"sync"

	"github.com/microcosm-cc/bluemonday"
)

//go:embed static
var static embed.FS

// AssetPrefix is where the page's assets are served.
const AssetPrefix = "/console/"

// CSP is the page's Content-Security-Policy: scripts, styles and
// connections from chime itself only, images also as data: URLs (a
// sanitized detail's remote images are not loaded, so an agent cannot
// make the page call out), no plugins, no <base>, no framing.
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

// detailPolicy is the sanitizer of notification details: bluemonday's
// policy for user-generated content (formatting, lists, tables, links,
// images; no script, no event handler, no style, no form, no frame), with
// links opened outside the page and marked nofollow noopener. A policy is
// safe for concurrent use once built.
var detailPolicy = sync.OnceValue(func() *bluemonday.Policy {
	p := bluemonday.UGCPolicy()
	p.AddTargetBlankToFullyQualifiedLinks(true)
	p.RequireNoReferrerOnLinks(true)
	return p
})

// SanitizeDetail returns a notification's detail, HTML as an agent sent
// it, made safe to insert into a page.
func SanitizeDetail(html string) string {
	if html == "" {
		return ""
	}
	return detailPolicy().Sanitize(html)
}
