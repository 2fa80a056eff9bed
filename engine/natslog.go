package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
)

// natsLog is the embedded nats-server's log, through chime's: its notices
// are debug lines (its start-up says two dozen things an operator does not
// need), its warnings and errors chime's own, and the last error is kept
// so that a start that fails says why.
type natsLog struct {
	log  *slog.Logger
	mu   sync.Mutex
	last string
}

func newNATSLog(log *slog.Logger) *natsLog {
	return &natsLog{log: log.With("component", "nats-server")}
}

func (l *natsLog) Noticef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *natsLog) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l *natsLog) Debugf(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *natsLog) Tracef(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }

func (l *natsLog) Errorf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.keep(msg)
	l.log.Error(msg)
}

// Fatalf is an error here: the server is ours to shut down, not the
// process's to exit.
func (l *natsLog) Fatalf(format string, v ...any) { l.Errorf(format, v...) }

func (l *natsLog) keep(msg string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.last = msg
}

// lastError is the last error the server logged ("" when none).
func (l *natsLog) lastError() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last
}

// debug reports whether log writes debug lines (the server's debug log
// is turned on with them).
func debug(log *slog.Logger) bool { return log.Enabled(context.Background(), slog.LevelDebug) }

// preflight checks, before an embedded server starts, the two things a
// fresh machine most often gets wrong, so that each fails at once with
// its cause and its setting rather than as a server that never gets
// ready: the listen address is free (a port below 1, the server's pick,
// is), and the data dir is writable.
func preflight(listen string, port int, dataDir string) error {
	if port > 0 {
		l, err := net.Listen("tcp", listen)
		if err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				return fmt.Errorf("engine: the NATS address %s is in use (another nats-server, or chime, runs there): set CHIME_NATS_LISTEN to a free address, or CHIME_NATS_URL to use that server", listen)
			}
			return fmt.Errorf("engine: cannot listen on %s (CHIME_NATS_LISTEN): %w", listen, err)
		}
		_ = l.Close()
	}
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return fmt.Errorf("engine: cannot make the data dir %s: %w: set CHIME_DATA_DIR to a folder chime may write", dataDir, err)
	}
	f, err := os.CreateTemp(dataDir, ".write-check-*")
	if err != nil {
		return fmt.Errorf("engine: the data dir %s is not writable: %w: set CHIME_DATA_DIR to a folder chime may write", dataDir, err)
	}
	_ = f.Close()
	_ = os.Remove(f.Name())
	return nil
}

// connectError says why a connection to an external NATS failed, with
// the settings to look at.
func connectError(rawURL string, err error) error {
	where := redact(rawURL)
	switch {
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired), errors.Is(err, nats.ErrAuthRevoked):
		return fmt.Errorf("engine: NATS at %s refused chime's credentials (CHIME_NATS_CREDS, CHIME_NATS_NKEY_FILE or CHIME_NATS_TOKEN): %w", where, err)
	case errors.Is(err, nats.ErrNoServers):
		return fmt.Errorf("engine: no NATS server answered at %s (CHIME_NATS_URL)%s: %w", where, dialCause(rawURL), err)
	}
	return fmt.Errorf("engine: connect to NATS at %s (CHIME_NATS_URL): %w", where, err)
}

// dialCause is why the first server of a URL list cannot be reached, as
// ": connection refused", or "" when it can (the failure was elsewhere).
func dialCause(rawURL string) string {
	first, _, _ := strings.Cut(rawURL, ",")
	u, err := url.Parse(strings.TrimSpace(first))
	if err != nil || u.Host == "" {
		return ""
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "4222")
	}
	c, err := net.DialTimeout("tcp", host, time.Second)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Err != nil {
			return ": " + op.Err.Error()
		}
		return ": " + err.Error()
	}
	_ = c.Close()
	return ""
}

// redact drops the user information of each URL in a list.
func redact(rawURL string) string {
	parts := strings.Split(rawURL, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			u.User = nil
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}
