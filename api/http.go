package api

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/console"
	"github.com/chime-nats/chime/subjects"
)

// Gateway is the HTTP side of chime.
type Gateway struct {
	srv     *http.Server
	ln      net.Listener
	log     *slog.Logger
	done    chan error
	started bool
	once    sync.Once
	err     error
}

// Mount is a handler served beside the action routes, behind the same
// guard (the MCP server).
type Mount struct {
	Pattern string
	Handler http.Handler
}

// NewHandler returns the HTTP routes over ops, and mounts. ready reports
// readiness; resolver, when it has operator tokens, guards the operator and
// agent routes.
func NewHandler(ops *Operations, gatherer prometheus.Gatherer, ready func() (bool, string), resolver access.Resolver, mounts ...Mount) http.Handler {
	mux := http.NewServeMux()
	for _, m := range mounts {
		mux.Handle(m.Pattern, m.Handler)
	}
	// route serves an action. Every route reads its body under the action's
	// limit, whether it uses the body or not; body makes the request the
	// action decodes from the request and the body read.
	route := func(a *action.Action, body func(r *http.Request, read []byte) []byte) {
		mux.HandleFunc(a.HTTP.Pattern(), func(w http.ResponseWriter, r *http.Request) {
			err := mayCall(r, a)
			var read []byte
			if err == nil {
				read, err = ops.readBody(w, r, a.Name)
			}
			var res any
			if err == nil {
				res, err = ops.Do(r.Context(), "http", a.Name, r.PathValue("id"), body(r, read))
			}
			if err != nil {
				writeError(w, err)
				return
			}
			writeJSON(w, a.HTTP.Status, encode(res))
		})
	}
	for _, a := range ops.Table().All() {
		if a.HTTP == nil {
			continue
		}
		body := a.HTTP.Body
		if body == nil {
			body = asSent
		}
		route(a, body)
	}
	notificationFeeds(mux, ops)
	for _, mode := range callbacks.DeliveryModes() {
		mux.HandleFunc("POST /api/callbacks/"+mode.Route()+"/{token}", func(w http.ResponseWriter, r *http.Request) {
			res, err := callback(ops, mode, w, r)
			if err != nil {
				writeError(w, err)
				return
			}
			writeJSON(w, http.StatusOK, encode(res))
		})
	}

	consoleViews(mux, ops)
	fleetViews(mux, ops)
	console.Register(mux)
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, []byte(`{"ok":true}`))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ok, why := ready(); !ok {
			writeJSON(w, http.StatusServiceUnavailable, subjects.MarshalError(&subjects.Error{Code: subjects.CodeUnavailable, Message: "not ready: " + why}))
			return
		}
		writeJSON(w, http.StatusOK, []byte(`{"ok":true}`))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, subjects.MarshalError(&subjects.Error{Code: "not_found", Message: "no route for " + r.Method + " " + logPath(r.URL.Path)}))
	})
	return crossOrigin(guard{resolver}.wrap(ops.recoverHTTP(mux)))
}

// asSent passes a route's body to its action as it was sent.
func asSent(_ *http.Request, read []byte) []byte { return read }

// callback reads a callback request: the body under the callback limit
// (413 beyond, nothing stored), the token from the path.
func callback(ops *Operations, mode callbacks.DeliveryMode, w http.ResponseWriter, r *http.Request) (*callbacks.CallbackReply, error) {
	body, err := ops.readBody(w, r, callbackAction)
	if err != nil {
		return nil, err
	}
	return ops.Callback(r.Context(), "http", callbacks.Request{
		Mode: mode, Token: r.PathValue("token"), ContentType: r.Header.Get("Content-Type"),
		IdempotencyKey: r.Header.Get(subjects.HeaderIdempotencyKey), Body: body,
	})
}

// readBody is the one way a route reads its body: at most the action's
// limit (bodyLimit), and payload_too_large (413) beyond it. Reading stops
// at the limit, and http.MaxBytesReader has the server close the
// connection after the reply rather than drain the rest.
func (o *Operations) readBody(w http.ResponseWriter, r *http.Request, action string) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, o.bodyLimit(action)))
	if tooBig, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return nil, tooLarge(action, tooBig.Limit)
	}
	if err != nil {
		return nil, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "could not read the body"}
	}
	return b, nil
}

// writeError writes err's wire error with its status, and a storage
// outage's Retry-After.
func writeError(w http.ResponseWriter, err error) {
	if after, ok := retryAfterSeconds(err); ok {
		w.Header().Set("Retry-After", after)
	}
	e := subjects.AsError(err)
	writeJSON(w, httpStatus(e), subjects.MarshalError(e))
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// Timeouts bound the phases of an HTTP connection, so that a client that
// sends slowly (slowloris), never finishes its body or never reads its
// reply cannot hold a connection and its goroutine for ever. A zero field
// takes its default (DefaultTimeouts).
type Timeouts struct {
	ReadHeader time.Duration // the request line and headers
	Read       time.Duration // the whole request, body included
	Write      time.Duration // from the end of the headers to the end of the reply
	Idle       time.Duration // a keep-alive connection between requests
}

// DefaultTimeouts are the gateway's timeouts:
//   - ReadHeader 5 s: headers are a few hundred bytes.
//   - Read 30 s: time for a 256 KiB callback body over a slow link.
//   - Write 60 s: it runs from the end of the headers, so it covers a slow
//     body (up to Read) plus the 10 s a request may spend on storage, and an
//     `unavailable` answer still goes out. A long-lived response (Server-Sent
//     Events) lifts its own write deadline with
//     http.ResponseController.SetWriteDeadline, write by write, rather
//     than have this one raised for every route.
//   - Idle 120 s: a keep-alive connection waits that long for its next
//     request.
func DefaultTimeouts() Timeouts {
	return Timeouts{ReadHeader: 5 * time.Second, Read: 30 * time.Second, Write: 60 * time.Second, Idle: 120 * time.Second}
}

func (t Timeouts) orDefaults() Timeouts {
	d := DefaultTimeouts()
	if t.ReadHeader <= 0 {
		t.ReadHeader = d.ReadHeader
	}
	if t.Read <= 0 {
		t.Read = d.Read
	}
	if t.Write <= 0 {
		t.Write = d.Write
	}
	if t.Idle <= 0 {
		t.Idle = d.Idle
	}
	return t
}

// NewGateway returns a gateway that serves h on ln, within timeouts t,
// from Start until Stop. It owns ln: Stop closes it, started or not.
func NewGateway(ln net.Listener, h http.Handler, log *slog.Logger, t Timeouts) *Gateway {
	t = t.orDefaults()
	// Shutdown waits for every request to end, and a stream never would:
	// streams watch this channel, closed as the shutdown begins.
	stopping := make(chan struct{})
	base := context.WithValue(context.Background(), stoppingKey{}, stopping)
	log = log.With("component", "http")
	g := &Gateway{
		srv: &http.Server{
			Handler: h, ReadHeaderTimeout: t.ReadHeader, ReadTimeout: t.Read, WriteTimeout: t.Write, IdleTimeout: t.Idle,
			BaseContext: func(net.Listener) context.Context { return base },
			// The server's own errors (a failed TLS handshake, a handler's
			// panic) go to chime's log, not the process-wide one.
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
		ln:   ln,
		log:  log,
		done: make(chan error, 1),
	}
	g.srv.RegisterOnShutdown(func() { close(stopping) })
	return g
}

// Start serves in the background; it cannot fail, the listener being
// bound already.
func (g *Gateway) Start(context.Context) error {
	g.started = true
	go func() { g.done <- g.srv.Serve(g.ln) }()
	g.log.Info("http listening", "addr", g.ln.Addr().String())
	return nil
}

// Addr is the bound address.
func (g *Gateway) Addr() string { return g.ln.Addr().String() }

// Stop shuts the server down gracefully within ctx. Idempotent; without
// Start it closes the listener.
func (g *Gateway) Stop(ctx context.Context) error {
	g.once.Do(func() {
		if !g.started {
			g.err = g.ln.Close()
			return
		}
		g.err = g.srv.Shutdown(ctx)
		<-g.done
	})
	return g.err
}
