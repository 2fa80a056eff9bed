package api

import (
	"fmt"
	"net/http"
	"runtime/debug"

	"github.com/chime-nats/chime/subjects"
)

// errInternal answers a request whose handler panicked.
var errInternal = &subjects.Error{Code: subjects.CodeInternal, Message: "internal error"}

// recovered logs and counts a handler panic on surface; what names the
// request (its subject or route). The stack goes to the log, never to the
// caller.
func (o *Operations) recovered(surface, what string, r any) {
	o.panics.WithLabelValues(surface).Inc()
	o.log.Error("request handler panicked", "surface", surface, "request", what,
		"panic", fmt.Sprint(r), "stack", string(debug.Stack()))
}

// recoverHTTP answers a route that panicked with internal (500), counted
// and logged as on NATS. http.ErrAbortHandler is the route's own way to
// cut a reply short and is passed on.
func (o *Operations) recoverHTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w := &wroteWriter{ResponseWriter: rw}
		defer func() {
			rec := recover()
			if rec == nil {
				return
			}
			if rec == http.ErrAbortHandler {
				panic(rec)
			}
			o.recovered("http", r.Method+" "+r.Pattern, rec)
			if w.wrote {
				// A reply under way (a stream) cannot become a 500: the
				// server cuts the connection instead.
				panic(http.ErrAbortHandler)
			}
			writeError(w, errInternal)
		}()
		next.ServeHTTP(w, r)
	})
}

// wroteWriter notes whether a reply has begun. Unwrap keeps
// http.ResponseController (flushes, write deadlines) working through it.
type wroteWriter struct {
	http.ResponseWriter
	wrote bool
}

func (w *wroteWriter) WriteHeader(status int) {
	w.wrote = true
	w.ResponseWriter.WriteHeader(status)
}

func (w *wroteWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

func (w *wroteWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
