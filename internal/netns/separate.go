package netns

import (
	"context"
	"fmt"
)

// Separate cuts the path between members a and b only: each gets a
// blackhole route to the other's address, so their packets to each
// other are dropped (TCP stalls, no reset) while both still reach the
// host and every other member. A server separated from all its peers but
// not from its clients is the minority side of a partition its clients
// cannot see.
func (l *Lab) Separate(ctx context.Context, a, b string) error { return l.route(ctx, "add", a, b) }

// Join undoes Separate.
func (l *Lab) Join(ctx context.Context, a, b string) error { return l.route(ctx, "del", a, b) }

func (l *Lab) route(ctx context.Context, op, a, b string) error {
	ma, mb := l.Member(a), l.Member(b)
	if ma == nil || mb == nil {
		return fmt.Errorf("netns: no member %s or %s", a, b)
	}
	for _, p := range [][2]*Member{{ma, mb}, {mb, ma}} {
		if err := run(ctx, l.ip+" -n "+p[0].NS, fmt.Sprintf("route %s blackhole %s/32", op, p[1].Addr)); err != nil {
			return fmt.Errorf("netns: %s the route from %s to %s: %w", op, p[0].Name, p[1].Name, err)
		}
	}
	return nil
}
