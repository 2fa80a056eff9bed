package api

import (
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// AccessLog logs each request h serves at info: method, path (a callback's
// token cut off), status, bytes written and duration, and the remote
// address. Query strings are left out: they may carry a cursor or a
// filter, never needed to tell what happened.
func AccessLog(h http.Handler, log *slog.Logger) http.Handler {
	log = log.With("component", "http")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &recorder{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(rec, r)
		log.Info("request", "method", r.Method, "path", logPath(r.URL.Path), "status", rec.status, "bytes", rec.bytes,
			"duration_ms", float64(time.Since(start).Microseconds())/1000, "remote", r.RemoteAddr)
	})
}

// logPath is a request's path as a log may show it: a callback's path
// ends in its token, a secret.
func logPath(path string) string {
	if strings.HasPrefix(path, "/api/callbacks/") {
		return "/api/callbacks/..."
	}
	return path
}

// recorder notes the status and size of a response.
type recorder struct {
	http.ResponseWriter
	status int
	bytes  int64
	wrote  bool
}

func (r *recorder) WriteHeader(status int) {
	if !r.wrote {
		r.status, r.wrote = status, true
	}
	r.ResponseWriter.WriteHeader(status)
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wrote = true
	n, err := r.ResponseWriter.Write(b)
	r.bytes += int64(n)
	return n, err
}

// Flush passes a stream's flushes on (server-sent events, the inbox's
// lines).
func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection (a WebSocket's
// hijack, a stream's deadlines).
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
