package api

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/subjects"
)

// guard lets a request through when its bearer token's principal may call
// the route: an operator every route, an agent only the reads of its own
// agent (GET /api/agents/{own id}/...). Callbacks, health and metrics need
// no token. Without operator tokens configured the routes are open (chime
// then listens on loopback only, see config).
type guard struct {
	resolver access.Resolver
}

// authTimeout bounds an agent token's lookup.
const authTimeout = 5 * time.Second

func (g guard) wrap(next http.Handler) http.Handler {
	if !g.resolver.Operators.Enabled() {
		return next
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
		case p.Kind == access.KindOperator, p.Kind == access.KindAgent && r.Method == http.MethodGet && ownRead(r.URL.Path, p.AgentID) && !operatorOnly(r.URL.Path):
			next.ServeHTTP(w, r)
		default:
			writeError(w, &subjects.Error{Code: subjects.CodeForbidden, Message: p.Name() + " may not call " + r.Method + " " + r.URL.Path})
		}
	})
}

// protected reports the routes that need a principal: control, the agent
// list, the agent-scoped reads, and the feed of every agent's
// notifications (which is no agent's own read, so operators' only).
func protected(path string) bool {
	return strings.HasPrefix(path, "/api/control/") || path == "/api/agents" || strings.HasPrefix(path, "/api/agents/") ||
		strings.HasPrefix(path, "/api/notifications/")
}

// operatorOnly reports the agent-scoped reads an agent may not make of its
// own: the live inbox feed, a stream an operator's console holds open (an
// agent reads its inbox through its own consumer).
func operatorOnly(path string) bool { return strings.HasSuffix(path, "/inbox/events") }

// ownRead reports a read route of agentID's own.
func ownRead(path, agentID string) bool {
	rest, ok := strings.CutPrefix(path, "/api/agents/"+agentID)
	return ok && (rest == "" || strings.HasPrefix(rest, "/"))
}
