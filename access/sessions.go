package access

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A revoked token must end the connections it opened, not only the next
// connect: the server keeps an admitted client's rights for as long as it
// stays connected. The callout writes down where it admitted each client
// (the server's ID and the client's ID there) under its principal, and a
// revocation asks those servers to disconnect them; the client's reconnect
// then meets the callout again, which refuses the revoked token. Users are
// also issued with an expiry (SessionsConfig.MaxAge), which bounds a
// session whose record was lost.

// RevokedSubject is where a replica that revoked a principal's token says
// so (the body: the principal's Name), for every replica to end the
// principal's event streams. Only chime may publish it.
const RevokedSubject = "chime.revoked"

// Kicker disconnects one client of one server.
type Kicker interface {
	Kick(ctx context.Context, serverID string, cid uint64) error
}

// ServerKicker kicks the clients of an embedded server, in process.
type ServerKicker struct{ Server EmbeddedServer }

// EmbeddedServer is the part of an embedded *server.Server a ServerKicker
// uses. An interface, so that access (which the public client links for its
// token replies) does not link nats-server.
type EmbeddedServer interface {
	ID() string
	DisconnectClientByID(cid uint64) error
}

// Kick disconnects cid if serverID is this server; a session of another
// server (this one before a restart) is gone.
func (k ServerKicker) Kick(_ context.Context, serverID string, cid uint64) error {
	if serverID != k.Server.ID() {
		return errNoSuchClient
	}
	if err := k.Server.DisconnectClientByID(cid); err != nil {
		return fmt.Errorf("%w: %v", errNoSuchClient, err)
	}
	return nil
}

// SystemKicker kicks clients through the system account's service
// ($SYS.REQ.SERVER.<id>.KICK), on a connection of a system account user.
type SystemKicker struct{ NC *nats.Conn }

// Kick asks serverID to disconnect cid.
func (k SystemKicker) Kick(ctx context.Context, serverID string, cid uint64) error {
	body, _ := json.Marshal(kickRequest{CID: cid})
	res, err := k.NC.RequestWithContext(ctx, "$SYS.REQ.SERVER."+serverID+".KICK", body)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil // that server is gone, and its clients with it
	}
	if err != nil {
		return fmt.Errorf("access: kick %d on %s: %w", cid, serverID, err)
	}
	var reply kickReply
	if err := json.Unmarshal(res.Data, &reply); err != nil {
		return fmt.Errorf("access: kick %d on %s: %w", cid, serverID, err)
	}
	if reply.Error != nil {
		return fmt.Errorf("%w: %s", errNoSuchClient, reply.Error.Description)
	}
	return nil
}

// kickRequest and kickReply are the parts chime reads of nats-server's
// KickClientReq and ServerAPIResponse.
type kickRequest struct {
	CID uint64 `json:"cid"`
}

type kickReply struct {
	Error *struct {
		Description string `json:"description"`
	} `json:"error,omitempty"`
}

// errNoSuchClient is a kick of a client already gone: nothing to end.
var errNoSuchClient = errors.New("access: no such client")

// SessionsConfig configures Sessions.
type SessionsConfig struct {
	// KV holds one key per admitted connection,
	// <kind>.<agent|trigger>.<server id>.<slot> holding a client ID
	// admitted there (at most 64 slots: maxSessionsPerServer), kept MaxAge.
	KV   jetstream.KeyValue
	Kick Kicker
	// MaxAge is how long an admitted user is valid: the server disconnects
	// it then, and it must connect (and be decided) again.
	MaxAge time.Duration
	// Recheck is how long after a revocation its sessions are looked for
	// once more, for connects decided while it was made.
	Recheck time.Duration
	Log     *slog.Logger
}

// Sessions remembers who is connected where and ends a principal's
// connections when its token is revoked.
type Sessions struct {
	cfg SessionsConfig
	log *slog.Logger
	// pending are the rechecks after revocations, waited for by Stop.
	pending sync.WaitGroup
	ctx     context.Context
	cancel  context.CancelFunc
}

// NewSessions returns Sessions, ready as made; Stop ends its rechecks.
func NewSessions(cfg SessionsConfig) *Sessions {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Recheck <= 0 {
		cfg.Recheck = 2 * time.Second
	}
	s := &Sessions{cfg: cfg, log: cfg.Log.With("component", "sessions")}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// Start does nothing: Sessions is ready as made, and its rechecks run
// as revocations come. It completes the lifecycle shape Stop belongs to.
func (s *Sessions) Start(context.Context) error { return nil }

// Stop cancels the rechecks in flight and waits for them. Idempotent and
// safe without Start.
func (s *Sessions) Stop(context.Context) error {
	if s == nil {
		return nil
	}
	s.cancel()
	s.pending.Wait()
	return nil
}

// MaxAge is how long an admitted user is valid.
func (s *Sessions) MaxAge() time.Duration { return s.cfg.MaxAge }

// sessionPrefix is the key prefix of p's sessions; empty for principals
// whose tokens are not revoked (operators: their tokens live in a file).
func sessionPrefix(p Principal) string {
	switch p.Kind {
	case KindAgent:
		return "agent." + p.AgentID
	case KindCallback:
		return "callback." + p.TriggerID
	}
	return ""
}

// maxSessionsPerServer bounds the connections recorded for one principal
// on one server: a connection's record is one of that many slots (its
// client ID modulo), so a principal reconnecting in a loop overwrites its
// own records and never fills the bucket for everyone else. A record it
// overwrites is of a connection most likely closed already; were it open,
// its expiry (MaxAge) still ends it. Plain writes, not one record updated
// by CAS: a principal's connects at once must not queue behind each other
// within the server's auth timeout.
const maxSessionsPerServer = 64

// Record writes down that p was admitted as client cid of serverID.
func (s *Sessions) Record(ctx context.Context, p Principal, serverID string, cid uint64) error {
	prefix := sessionPrefix(p)
	if prefix == "" || serverID == "" || strings.ContainsAny(serverID, ".*> ") {
		return nil
	}
	key := prefix + "." + serverID + "." + strconv.FormatUint(cid%maxSessionsPerServer, 10)
	if _, err := s.cfg.KV.Put(ctx, key, []byte(strconv.FormatUint(cid, 10))); err != nil {
		return fmt.Errorf("access: record session: %w", err)
	}
	return nil
}

// End disconnects every connection admitted as p and says how many it
// ended, then looks again after Recheck for connects decided meanwhile. A
// failure is logged, not returned: the token is revoked already, and the
// second look, or else the users' MaxAge, ends what this one could not.
// Nil Sessions end nothing.
func (s *Sessions) End(ctx context.Context, p Principal) int {
	if s == nil {
		return 0
	}
	n, err := s.end(ctx, p)
	if err != nil {
		s.log.Warn("ending a revoked principal's sessions", "principal", p.Name(), "ended", n, "err", err)
	}
	s.pending.Go(func() {
		select {
		case <-time.After(s.cfg.Recheck):
		case <-s.ctx.Done():
			return
		}
		ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
		defer cancel()
		if _, err := s.end(ctx, p); err != nil && s.ctx.Err() == nil {
			s.log.Warn("second look for a revoked principal's sessions", "principal", p.Name(), "err", err)
		}
	})
	return n
}

func (s *Sessions) end(ctx context.Context, p Principal) (int, error) {
	prefix := sessionPrefix(p)
	if prefix == "" {
		return 0, nil
	}
	keys, err := s.cfg.KV.ListKeysFiltered(ctx, prefix+".>")
	if err != nil {
		return 0, fmt.Errorf("access: sessions of %s: %w", p.Name(), err)
	}
	var ended int
	var errs []error
	for key := range keys.Keys() {
		serverID, _, _ := strings.Cut(strings.TrimPrefix(key, prefix+"."), ".")
		e, err := s.cfg.KV.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cid, perr := strconv.ParseUint(string(e.Value()), 10, 64)
		if perr == nil {
			switch err := s.cfg.Kick.Kick(ctx, serverID, cid); {
			case err == nil:
				ended++
			case errors.Is(err, errNoSuchClient):
			default:
				errs = append(errs, err)
				continue // kept, for the recheck to try again
			}
		}
		// Only this record: one written meanwhile in its slot stays.
		if err := s.cfg.KV.Delete(ctx, key, jetstream.LastRevision(e.Revision())); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) && !wrongRevision(err) {
			errs = append(errs, err)
		}
	}
	return ended, errors.Join(errs...)
}

// wrongRevision is a conditional write refused because the key changed.
func wrongRevision(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}
