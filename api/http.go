package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

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

// NewHandler returns the HTTP routes over ops. ready reports readiness.
func NewHandler(ops *Operations, gatherer prometheus.Gatherer, ready func() bool) http.Handler {
	mux := http.NewServeMux()
	route := func(pattern, action string, body func(*http.Request) ([]byte, error), status int) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			b, err := body(r)
			var res any
			if err == nil {
				res, err = ops.Do(r.Context(), "http", action, r.PathValue("id"), b)
			}
			if err != nil {
				e := subjects.AsError(err)
				writeJSON(w, subjects.HTTPStatus(e.Code), subjects.MarshalError(e))
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

	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, []byte(`{"ok":true}`))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			writeJSON(w, http.StatusServiceUnavailable, subjects.MarshalError(&subjects.Error{Code: subjects.CodeUnavailable, Message: "not ready"}))
			return
		}
		writeJSON(w, http.StatusOK, []byte(`{"ok":true}`))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, subjects.MarshalError(&subjects.Error{Code: "not_found", Message: "no route for " + r.Method + " " + r.URL.Path}))
	})
	return mux
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

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// StartGateway listens on addr and serves h until Stop.
func StartGateway(addr string, h http.Handler, log *slog.Logger) (*Gateway, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("api: http listen %s: %w", addr, err)
	}
	g := &Gateway{
		srv:  &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second},
		ln:   ln,
		log:  log.With("component", "http"),
		done: make(chan error, 1),
	}
	go func() { g.done <- g.srv.Serve(ln) }()
	g.log.Info("http listening", "addr", ln.Addr().String())
	return g, nil
}

// Addr is the bound address.
func (g *Gateway) Addr() string { return g.ln.Addr().String() }

// Stop shuts the server down gracefully within ctx.
func (g *Gateway) Stop(ctx context.Context) error {
	err := g.srv.Shutdown(ctx)
	<-g.done
	return err
}
