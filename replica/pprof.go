package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// profiles serves Go's /debug/pprof on its own loopback listener
// (CHIME_PPROF_ADDR), apart from the gateway: a CPU profile outlasts the
// gateway's write timeout, and profiles are never for the network.
type profiles struct {
	srv  *http.Server
	done chan error
}

func startProfiles(addr string, log *slog.Logger) (*profiles, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("replica: pprof listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	p := &profiles{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, done: make(chan error, 1)}
	go func() { p.done <- p.srv.Serve(ln) }()
	log.Info("pprof listening", "addr", ln.Addr().String())
	return p, nil
}

// stop closes the listener and any profile in progress.
func (p *profiles) stop(ctx context.Context) error {
	err := p.srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		err = p.srv.Close() // a profile still running is cut short
	}
	<-p.done
	return err
}
