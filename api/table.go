package api

import (
	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/action"
)

// features are the actions of every feature, in the order the service
// lists them. Adding a feature's actions is one line here.
func (o *Operations) features() [][]action.Action {
	return [][]action.Action{
		o.store.Actions(o.quotas),
		o.waitOps.Actions(o.quotas, o.waitFor, o.tz),
		o.triggers.Actions(),
		o.tokens.Actions(),
		o.waitFor.Actions(o.quotas),
		o.questions.Actions(o.quotas),
		o.tasks.Actions(),
		o.monitors.Actions(),
		o.notifications.Actions(o.quotas),
		o.inbox.Actions(),
	}
}

// Rights are what principals may request over NATS, from the action table
// (which needs no storage to be read).
func Rights() access.Rights { return access.RightsOf(NewOperations(Config{}).table) }
