package access

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/internal/pacer"
)

// CalloutSubject is where the server asks who a connecting client is.
const CalloutSubject = "$SYS.REQ.USER.AUTH"

// calloutQueue lets any one replica answer each connect.
const calloutQueue = "chime-auth"

// CallbackResolver finds the live trigger of a callback token.
type CallbackResolver interface {
	Resolve(token string, mode callbacks.DeliveryMode) (*callbacks.Trigger, error)
}

// CalloutConfig configures the auth callout.
type CalloutConfig struct {
	// NC is a connection of chime's service user (one of the callout's
	// auth_users, so it is not itself called out for).
	NC *nats.Conn
	// Issuer signs the users it admits; the server's auth_callout issuer
	// is its public key.
	Issuer nkeys.KeyPair
	// Account is where admitted users are placed: "$G" (the default) when
	// the server config has no accounts.
	Account  string
	Resolver Resolver
	// Rights are what principals may request (RightsOf the action table).
	Rights Rights
	// Sessions, when set, records where each agent and callback sender is
	// admitted, so that revoking its token ends its connections, and
	// bounds each admitted user by its MaxAge.
	Sessions *Sessions
	Log      *slog.Logger
	// Registerer receives chime_auth_connects_total; nil registers none.
	Registerer prometheus.Registerer
}

// ErrNoRights refuses a callout configured without the rights it grants.
var ErrNoRights = errors.New("access: callout without rights: it would admit every principal with every right")

// Callout answers the server's authorization requests: it resolves the
// connect token to a principal and admits the client with exactly that
// principal's permissions, or refuses it.
type Callout struct {
	cfg      CalloutConfig
	log      *slog.Logger
	sub      *nats.Subscription
	sem      chan struct{}
	ctx      context.Context
	cancel   context.CancelFunc
	connects *prometheus.CounterVec
	// unrecorded counts connects admitted without a session record, and
	// unrecordedLog paces their log lines.
	unrecorded    prometheus.Counter
	unrecordedLog *pacer.Pacer
}

// calloutConcurrency bounds connects resolved at once per replica; a
// lookup is one KV read, and the server waits at most its auth timeout.
const calloutConcurrency = 64

// lookupTimeout bounds one token lookup, below the server's auth timeout.
const lookupTimeout = 1500 * time.Millisecond

// NewCallout returns the callout; Start subscribes it.
func NewCallout(cfg CalloutConfig) *Callout {
	if cfg.Account == "" {
		cfg.Account = "$G"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	c := &Callout{
		cfg: cfg, log: cfg.Log.With("component", "auth"), sem: make(chan struct{}, calloutConcurrency),
		connects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chime_auth_connects_total",
			Help: "NATS connects chime's auth callout decided, by principal kind (agent, operator, callback, none) and outcome (admitted, refused, error).",
		}, []string{"principal", "outcome"}),
		unrecorded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chime_auth_sessions_unrecorded_total",
			Help: "NATS connects admitted whose session record could not be written: a revocation ends them only at their expiry.",
		}),
		unrecordedLog: pacer.New(10 * time.Second),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(c.connects, c.unrecorded)
	}
	return c
}

// Start subscribes to the callout subject and returns once the server
// knows it; the callout answers until Stop.
func (c *Callout) Start(ctx context.Context) error {
	// A user with no publish allowances may publish anywhere: rights
	// left out would admit every token with every right.
	if len(c.cfg.Rights.Agent) == 0 || len(c.cfg.Rights.All) == 0 {
		return ErrNoRights
	}
	c.ctx, c.cancel = context.WithCancel(context.WithoutCancel(ctx))
	sub, err := c.cfg.NC.QueueSubscribe(CalloutSubject, calloutQueue, func(m *nats.Msg) {
		select {
		case c.sem <- struct{}{}:
		case <-c.ctx.Done():
			return
		}
		go func() {
			defer func() { <-c.sem }()
			c.answer(m)
		}()
	})
	if err != nil {
		c.cancel()
		return fmt.Errorf("access: auth callout: %w", err)
	}
	c.sub = sub
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.cfg.NC.FlushWithContext(fctx); err != nil {
		_ = sub.Unsubscribe()
		c.sub = nil
		c.cancel()
		return fmt.Errorf("access: auth callout: %w", err)
	}
	return nil
}

// Stop stops answering. Idempotent and safe without Start.
func (c *Callout) Stop(context.Context) error {
	if c == nil || c.cancel == nil {
		return nil
	}
	c.cancel()
	if c.sub != nil {
		_ = c.sub.Unsubscribe()
	}
	return nil
}

func (c *Callout) answer(m *nats.Msg) {
	req, err := jwt.DecodeAuthorizationRequestClaims(string(m.Data))
	if err != nil {
		c.log.Warn("undecodable authorization request", "err", err)
		return // nothing to address a reply to: the server times it out
	}
	ctx, cancel := context.WithTimeout(c.ctx, lookupTimeout)
	defer cancel()
	p, err := c.cfg.Resolver.Resolve(ctx, req.ConnectOptions.Token)
	if err == nil && c.cfg.Sessions != nil {
		err = c.record(ctx, req, p)
	}
	kind := string(p.Kind)
	if kind == "" {
		kind = "none"
	}
	var userJWT, refusal string
	switch {
	case errors.Is(err, ErrUnknownToken):
		c.connects.WithLabelValues(kind, "refused").Inc()
		refusal = "not authorized"
	case err != nil:
		c.connects.WithLabelValues(kind, "error").Inc()
		c.log.Warn("authorization lookup failed", "client", req.ClientInformation.Name, "host", req.ClientInformation.Host, "err", err)
		refusal = "authorization unavailable, try again"
	default:
		if userJWT, err = c.user(req.UserNkey, p); err != nil {
			c.connects.WithLabelValues(kind, "error").Inc()
			c.log.Error("signing a user", "principal", p.Name(), "err", err)
			refusal = "authorization unavailable, try again"
		} else {
			c.connects.WithLabelValues(kind, "admitted").Inc()
		}
	}
	res := jwt.NewAuthorizationResponseClaims(req.UserNkey)
	res.Audience = req.Server.ID
	res.Jwt = userJWT
	res.Error = refusal
	out, err := res.Encode(c.cfg.Issuer)
	if err != nil {
		c.log.Error("signing an authorization response", "err", err)
		return
	}
	if err := m.Respond([]byte(out)); err != nil {
		c.log.Debug("authorization response", "err", err)
	}
}

// record writes down where p is being admitted, then resolves its token
// again: a revocation that listed p's sessions before this record was
// written has by then removed the token, so the connect is refused here
// instead of outliving it (see Sessions).
//
// A record that cannot be written does not refuse the connect: the user's
// expiry (Sessions.MaxAge) still bounds it, and refusing would let a full
// or unreachable sessions bucket lock every agent out.
func (c *Callout) record(ctx context.Context, req *jwt.AuthorizationRequestClaims, p Principal) error {
	if err := c.cfg.Sessions.Record(ctx, p, req.Server.ID, req.ClientInformation.ID); err != nil {
		c.unrecorded.Inc()
		c.unrecordedLog.Do(1, func(n int64) {
			c.log.Warn("admitted connections without their session record: a revocation ends them only at their expiry",
				"principal", p.Name(), "err", err, "connects", n)
		})
		return nil
	}
	if sessionPrefix(p) == "" {
		return nil
	}
	again, err := c.cfg.Resolver.Resolve(ctx, req.ConnectOptions.Token)
	if err != nil {
		return err
	}
	if again != p {
		return ErrUnknownToken
	}
	return nil
}

// user is the signed user JWT that admits nkey as p, valid for the
// sessions' MaxAge: the server disconnects it then, and its reconnect is
// decided again.
func (c *Callout) user(nkey string, p Principal) (string, error) {
	uc := jwt.NewUserClaims(nkey)
	uc.Name = p.Name()
	uc.Audience = c.cfg.Account
	uc.Permissions = p.Permissions(c.cfg.Rights)
	if c.cfg.Sessions != nil && c.cfg.Sessions.MaxAge() > 0 {
		uc.Expires = time.Now().Add(c.cfg.Sessions.MaxAge()).Unix()
	}
	return uc.Encode(c.cfg.Issuer)
}

// Resolver resolves tokens to principals; the callout and the HTTP guard
// share it.
type Resolver struct {
	Operators *OperatorTokens
	Tokens    *Tokens
	Callbacks CallbackResolver // nil: callback tokens name no one
}

// LoadIssuer reads the account nkey seed that signs admitted users.
func LoadIssuer(path string) (nkeys.KeyPair, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("access: callout key: %w", err)
	}
	kp, err := nkeys.ParseDecoratedNKey(b)
	if err != nil {
		return nil, fmt.Errorf("access: callout key %s: not an nkey seed", path)
	}
	if pub, err := kp.PublicKey(); err != nil || !nkeys.IsValidPublicAccountKey(pub) {
		return nil, fmt.Errorf("access: callout key %s: not an account seed (SA...)", path)
	}
	return kp, nil
}

// Resolve names the principal of token, or fails with ErrUnknownToken.
func (r Resolver) Resolve(ctx context.Context, token string) (Principal, error) {
	switch {
	case token == "":
		return Principal{}, ErrUnknownToken
	case r.Operators.Match(token):
		return Principal{Kind: KindOperator}, nil
	case strings.HasPrefix(token, AgentTokenPrefix) && r.Tokens != nil:
		rec, err := r.Tokens.Lookup(ctx, token)
		if err != nil {
			return Principal{}, err
		}
		return Principal{Kind: KindAgent, AgentID: rec.AgentID}, nil
	case strings.HasPrefix(token, callbacks.TokenPrefix) && r.Callbacks != nil:
		for _, mode := range callbacks.DeliveryModes() {
			if t, err := r.Callbacks.Resolve(token, mode); err == nil {
				return Principal{Kind: KindCallback, AgentID: t.AgentID, TriggerID: t.ID}, nil
			}
		}
	}
	return Principal{}, ErrUnknownToken
}
