package quotas

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// limiter is a token bucket per agent, in memory, on this replica only:
// replicas share nothing, so an agent spread over n replicas gets up to n
// times the rate. The map is bounded: see evict.
type limiter struct {
	limit rate.Limit
	burst int
	max   int

	mu     sync.Mutex
	agents map[string]*rate.Limiter
}

func newLimiter(perSecond float64, burst, maxAgents int) *limiter {
	return &limiter{limit: rate.Limit(perSecond), burst: burst, max: maxAgents, agents: make(map[string]*rate.Limiter)}
}

// take takes one token of the agent's bucket at now, or reports how long
// until one is there. Times come from the caller, so a test's clock rules.
func (l *limiter) take(agentID string, now time.Time) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.agents[agentID]
	if !ok {
		if len(l.agents) >= l.max {
			l.evict(now)
		}
		b = rate.NewLimiter(l.limit, l.burst)
		l.agents[agentID] = b
	}
	if b.AllowN(now, 1) {
		return 0, true
	}
	missing := 1 - b.TokensAt(now)
	return time.Duration(missing / float64(l.limit) * float64(time.Second)), false
}

// evict makes room. A full bucket is forgotten at no cost (a new one
// starts full), so those go first. If that frees too little (more agents
// than max creating at once) arbitrary ones go too, down to 90 % of max, so
// eviction stays amortized O(1) per new agent; such an agent gets a full
// burst back early, a leniency bounded by the map's size. Called with mu
// held.
func (l *limiter) evict(now time.Time) {
	for id, b := range l.agents {
		if b.TokensAt(now) >= float64(l.burst) {
			delete(l.agents, id)
		}
	}
	for id := range l.agents {
		if len(l.agents) < l.max*9/10 {
			break
		}
		delete(l.agents, id)
	}
}

// len is how many agents are remembered.
func (l *limiter) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.agents)
}
