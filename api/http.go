package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/subjects"
)

// maxBody bounds request bodies of the timer routes.
const maxBody = 64 << 10

// Gateway is the HTTP side of chime.
type Gateway struct {
	srv  *http.Server
	ln   net.Listener
	log  *slog.Logger
	done chan error
}

// NewHandler returns the HTTP routes over ops. ready reports readiness;
// resolver, when it has operator tokens, guards the operator and agent routes.
func NewHandler(ops *Operations, gatherer prometheus.Gatherer, ready func() (bool, string), resolver access.Resolver) http.Handler {
	mux := http.NewServeMux()
	route := func(pattern, action string, body func(*http.Request) ([]byte, error), status int) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			b, err := body(r)
			var res any
			if err == nil {
				res, err = ops.Do(r.Context(), "http", action, r.PathValue("id"), b)
			}
			if err != nil {
				writeError(w, err)
				return
			}
			writeJSON(w, status, encode(res))
		})
	}
	readBody := func(r *http.Request) ([]byte, error) {
		b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: fmt.Sprintf("request body larger than %d bytes", maxBody)}
		}
		return b, err
	}
	timerRef := func(r *http.Request) ([]byte, error) {
		return encode(subjects.TimerRef{TimerID: r.PathValue("timer_id")}), nil
	}
	route("POST /api/control/agents/{id}/timers", subjects.ActionTimerCreate, readBody, http.StatusCreated)
	route("GET /api/agents/{id}/timers", subjects.ActionTimerList, func(r *http.Request) ([]byte, error) {
		if l := r.URL.Query().Get("limit"); l != "" {
			return encode(map[string]any{"limit": rawOrString(l)}), nil
		}
		return nil, nil
	}, http.StatusOK)
	route("GET /api/agents/{id}/timers/{timer_id}", subjects.ActionTimerGet, timerRef, http.StatusOK)
	route("POST /api/control/agents/{id}/timers/{timer_id}/cancel", subjects.ActionTimerCancel, timerRef, http.StatusOK)

	route("POST /api/control/agents/{id}/start", subjects.ActionLifecycleStart, readBody, http.StatusOK)
	route("POST /api/control/agents/{id}/stop", subjects.ActionLifecycleStop, readBody, http.StatusOK)
	route("POST /api/control/agents/{id}/reset-callback", subjects.ActionTriggerReset, readBody, http.StatusOK)
	route("POST /api/control/agents/{id}/triggers", subjects.ActionTriggerCreate, readBody, http.StatusCreated)
	route("POST /api/control/agents/{id}/triggers/{trigger_id}/cancel", subjects.ActionTriggerCancel, func(r *http.Request) ([]byte, error) {
		return encode(subjects.TriggerRef{ID: r.PathValue("trigger_id")}), nil
	}, http.StatusOK)
	route("GET /api/agents/{id}/triggers", subjects.ActionTriggerList, func(*http.Request) ([]byte, error) { return nil, nil }, http.StatusOK)
	route("POST /api/control/agents/{id}/token", subjects.ActionTokenIssue, readBody, http.StatusCreated)
	route("DELETE /api/control/agents/{id}/token", subjects.ActionTokenRevoke, readBody, http.StatusOK)
	for _, mode := range subjects.DeliveryModes() {
		mux.HandleFunc("POST /api/callbacks/"+mode.Route()+"/{token}", func(w http.ResponseWriter, r *http.Request) {
			res, err := callback(ops, mode, w, r)
			if err != nil {
				writeError(w, err)
				return
			}
			writeJSON(w, http.StatusOK, encode(res))
		})
	}

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
		path := r.URL.Path
		if strings.HasPrefix(path, "/api/callbacks/") {
			path = "/api/callbacks/..." // the rest may be a token
		}
		writeJSON(w, http.StatusNotFound, subjects.MarshalError(&subjects.Error{Code: "not_found", Message: "no route for " + r.Method + " " + path}))
	})
	return guard{resolver}.wrap(mux)
}

// callback reads a callback request: at most 256 KiB of body (413 beyond,
// nothing stored), the token from the path.
func callback(ops *Operations, mode subjects.DeliveryMode, w http.ResponseWriter, r *http.Request) (*subjects.CallbackReply, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, subjects.MaxCallbackBody))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return nil, &subjects.Error{Code: subjects.CodePayloadTooLarge, Message: "callback body larger than 256 KiB"}
	}
	if err != nil {
		return nil, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "could not read the body"}
	}
	return ops.Callback(r.Context(), "http", callbacks.Request{
		Mode: mode, Token: r.PathValue("token"), ContentType: r.Header.Get("Content-Type"),
		IdempotencyKey: r.Header.Get(subjects.HeaderIdempotencyKey), Body: body,
	})
}

// rawOrString passes a numeric query value as a JSON number and anything
// else as a string, so the limit rules and texts are those of NATS.
func rawOrString(v string) any {
	for i := 0; i < len(v); i++ {
		if (v[i] < '0' || v[i] > '9') && v[i] != '-' && v[i] != '.' {
			return v
		}
	}
	return jsonNumber(v)
}

type jsonNumber string

func (n jsonNumber) MarshalJSON() ([]byte, error) { return []byte(n), nil }

// writeError writes err's wire error with its status, and a storage
// outage's Retry-After.
func writeError(w http.ResponseWriter, err error) {
	if after, ok := retryAfterSeconds(err); ok {
		w.Header().Set("Retry-After", after)
	}
	e := subjects.AsError(err)
	writeJSON(w, httpStatus(e.Code), subjects.MarshalError(e))
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// StartGateway serves h on ln until Stop.
func StartGateway(ln net.Listener, h http.Handler, log *slog.Logger) *Gateway {
	g := &Gateway{
		srv:  &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second},
		ln:   ln,
		log:  log.With("component", "http"),
		done: make(chan error, 1),
	}
	go func() { g.done <- g.srv.Serve(ln) }()
	g.log.Info("http listening", "addr", ln.Addr().String())
	return g
}

// Addr is the bound address.
func (g *Gateway) Addr() string { return g.ln.Addr().String() }

// Stop shuts the server down gracefully within ctx.
func (g *Gateway) Stop(ctx context.Context) error {
	err := g.srv.Shutdown(ctx)
	<-g.done
	return err
}
