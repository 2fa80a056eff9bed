package api

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/internal/secret"
	"github.com/chime-nats/chime/subjects"
)

// guard lets a request through when its bearer token's principal may call
// the route: an operator every route, an agent the reads of its own agent
// (GET /api/agents/{own id}/...), its inbox ack, and its own control
// routes, where each action's route then admits the agent only to the
// actions the table grants agents, as NATS does (see mayCall). Callbacks,
// health and metrics need no token. Without operator tokens configured the routes
// are open (chime then listens on loopback only, see config).
type guard struct {
	resolver access.Resolver
}

// authTimeout bounds an agent token's lookup.
const authTimeout = 5 * time.Second

func (g guard) wrap(next http.Handler) http.Handler {
	if !g.resolver.Operators.Enabled() {
		return loopbackOnly(next)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !protected(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		token = strings.TrimSpace(token)
		if !strings.EqualFold(scheme, "Bearer") {
			token = ""
		}
		ctx, cancel := context.WithTimeout(r.Context(), authTimeout)
		p, err := g.resolver.Resolve(ctx, token)
		cancel()
		switch {
		case errors.Is(err, access.ErrUnknownToken):
			w.Header().Set("WWW-Authenticate", `Bearer realm="chime"`)
			writeError(w, &subjects.Error{Code: subjects.CodeUnauthorized, Message: "an operator or agent bearer token is required"})
		case err != nil:
			writeError(w, answerError(err))
		case p.Kind == access.KindOperator:
			next.ServeHTTP(w, withPrincipal(r, principalName(p, token)))
		case p.Kind == access.KindAgent && (r.Method == http.MethodGet && ownRead(r.URL.Path, p.AgentID) ||
			ownWrite(r, p.AgentID) || strings.HasPrefix(r.URL.Path, "/api/control/agents/"+p.AgentID+"/")):
			next.ServeHTTP(w, withAgent(withPrincipal(r, principalName(p, token)), p.AgentID))
		default:
			writeError(w, &subjects.Error{Code: subjects.CodeForbidden, Message: p.Name() + " may not call " + r.Method + " " + r.URL.Path})
		}
	})
}

// loopbackOnly serves the protected routes, open without operator tokens,
// only to requests that name a loopback host. chime then listens on
// loopback (config), but a browser can still be made to reach it: a page
// whose DNS name is rebound to 127.0.0.1 is same-origin to itself and
// could read inboxes and mint agent tokens. Such a request names the
// page's host, not a loopback one.
func loopbackOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if protected(r.URL.Path) && !loopbackHost(r.Host) {
			writeError(w, &subjects.Error{Code: subjects.CodeForbidden, Message: "without operator tokens (CHIME_OPERATOR_TOKENS_FILE) " +
				"the API answers only requests to a loopback host (localhost, 127.0.0.1, [::1]), not " + strconv.Quote(r.Host)})
			return
		}
		next.ServeHTTP(w, withPrincipal(r, loopbackPrincipal))
	})
}

func loopbackHost(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = strings.Trim(hostport, "[]")
	}
	return config.Loopback(host)
}

// crossOrigin refuses the unsafe requests a browser sends from another
// site (CSRF): a page elsewhere could otherwise post to the control routes
// of a chime that takes them without a token, or ride a console's
// session. Callbacks are capability URLs that other sites call, and pass.
func crossOrigin(next http.Handler) http.Handler {
	c := http.NewCrossOriginProtection()
	c.AddInsecureBypassPattern("/api/callbacks/")
	c.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &subjects.Error{Code: subjects.CodeForbidden, Message: "a cross-origin " + r.Method + " from a browser is refused"})
	}))
	return c.Handler(next)
}

// protected reports the routes that need a principal: control, the agent
// list, the agent-scoped reads, the feed of every agent's notifications
// and the fleet views (which are no agent's own reads, so operators'
// only).
func protected(path string) bool {
	return strings.HasPrefix(path, "/api/control/") || path == "/api/agents" || strings.HasPrefix(path, "/api/agents/") ||
		strings.HasPrefix(path, "/api/notifications/") || path == "/api/fleet" || strings.HasPrefix(path, "/api/fleet/")
}

// ownRead reports a read route of agentID's own.
func ownRead(path, agentID string) bool {
	rest, ok := strings.CutPrefix(path, "/api/agents/"+agentID)
	return ok && (rest == "" || strings.HasPrefix(rest, "/"))
}

// principalKey holds, in a request's context, the name of the principal
// the guard let through, for the limits kept per principal.
type principalKey struct{}

// loopbackPrincipal is everyone calling without operator tokens configured:
// one principal, as nothing tells them apart.
const loopbackPrincipal = "loopback"

func withPrincipal(r *http.Request, name string) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), principalKey{}, name))
}

// principalName names a principal without a secret: an agent by its ID
// (all its tokens are the agent), an operator token by the start of its
// hash, as each operator token is a principal of its own.
func principalName(p access.Principal, token string) string {
	if p.Kind == access.KindOperator {
		return "operator token " + secret.Hash(token)[:12]
	}
	return p.Name()
}

// agentKey holds, in a request's context, the agent ID of an agent the
// guard let through.
type agentKey struct{}

func withAgent(r *http.Request, agentID string) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), agentKey{}, agentID))
}

// mayCall refuses an agent an action the table grants operators only.
func mayCall(r *http.Request, a *action.Action) error {
	if _, agent := r.Context().Value(agentKey{}).(string); !agent || a.Access == action.Agent {
		return nil
	}
	return &subjects.Error{Code: subjects.CodeForbidden, Message: requestPrincipal(r) + " may not call " + r.Method + " " + r.URL.Path}
}

// requestPrincipal is the name withPrincipal gave the request; a handler
// reached without the guard (none is) counts as loopback.
func requestPrincipal(r *http.Request) string {
	if name, ok := r.Context().Value(principalKey{}).(string); ok {
		return name
	}
	return loopbackPrincipal
}
