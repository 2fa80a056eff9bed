package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"
)

// profiles serves Go's /debug/pprof on its own loopback listener
// (CHIME_PPROF_ADDR), apart from the gateway: a CPU profile outlasts the
// gateway's write timeout, and profiles are never for the network.
type profiles struct {
	addr    string
	log     *slog.Logger
	srv     *http.Server
	done    chan error
	started bool
	once    sync.Once
	err     error
}

func newProfiles(addr string, log *slog.Logger) *profiles {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return &profiles{addr: addr, log: log, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, done: make(chan error, 1)}
}

// Start listens and serves in the background.
func (p *profiles) Start(context.Context) error {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return fmt.Errorf("replica: pprof listen %s: %w", p.addr, err)
	}
	p.started = true
	go func() { p.done <- p.srv.Serve(ln) }()
	p.log.Info("pprof listening", "addr", ln.Addr().String())
	return nil
}

// Stop closes the listener and, after a second at most, any profile in
// progress. Idempotent and safe without Start.
func (p *profiles) Stop(ctx context.Context) error {
	p.once.Do(func() {
		if !p.started {
			return
		}
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		p.err = p.srv.Shutdown(ctx)
		if errors.Is(p.err, context.DeadlineExceeded) || errors.Is(p.err, context.Canceled) {
			p.err = p.srv.Close() // a profile still running is cut short
		}
		<-p.done
	})
	return p.err
}
