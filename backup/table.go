package backup

import (
	"fmt"
	"strings"

	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/partitions"
)

// Table is the runbook's table of every stream, bucket and object store
// chime keeps, in both layouts, and whether a backup takes it: generated
// from engine.Inventory (see TestRunbookTable).
func Table() string {
	var b strings.Builder
	b.WriteString("| stream | kind | name | layout | backed up | holds |\n|---|---|---|---|---|---|\n")
	plain := map[string]bool{}
	row := func(r engine.Resource, layout string) {
		backed := "yes"
		if r.Transient != "" {
			backed = "no: " + r.Transient
		}
		fmt.Fprintf(&b, "| `%s` | %s | `%s` | %s | %s | %s |\n", r.Stream, r.Kind, r.Name, layout, backed, mdEscape(r.Description))
	}
	for _, r := range engine.Inventory(engine.Topology{}) {
		plain[r.Stream] = true
		row(r, "all")
	}
	// The sharded layout's own, each partition kind once.
	seen := map[string]bool{}
	for _, r := range engine.Inventory(engine.Topology{Layout: partitions.Layout{Partitions: 2, Shards: 2}}) {
		if plain[r.Stream] {
			continue
		}
		layout := "`CHIME_PARTITIONS` > 0"
		if base := partitions.Base(r.Name); base != r.Name {
			if seen[base] {
				continue
			}
			seen[base] = true
			r.Name, r.Stream = base+"_<n>", strings.TrimSuffix(r.Stream, r.Name)+base+"_<n>"
			r.Description = strings.ReplaceAll(r.Description, "partition 1 of 2", "partition n")
			layout = "`CHIME_PARTITIONS=P` > 1: n = 1 … P-1"
		}
		row(r, layout)
	}
	return b.String()
}

// mdEscape keeps a description's key patterns (<agent>.<id>) and pipes
// from being read as markdown.
func mdEscape(s string) string {
	return strings.NewReplacer("<", "\\<", "|", "\\|").Replace(s)
}
