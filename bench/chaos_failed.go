package bench

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/scheduler"
)

// What a failed chaos run keeps beyond the replicas' logs: who held the
// shards of the lost deliveries, and each replica's goroutines and
// metrics at the end, while the replicas still run in the state that lost
// them. A loss that no log explains is found from these.

// holders fills each loss's Holder from the lease bucket.
func (r *chaosRun) holders(ctx context.Context, lost []ChaosShardLoss) {
	if len(lost) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	kv, err := r.js.KeyValue(ctx, engine.LeasesBucket)
	if err != nil {
		r.progress("lease holders not read: %v", err)
		return
	}
	for i := range lost {
		e, err := kv.Get(ctx, scheduler.LeaseKey(lost[i].Shard))
		if err != nil {
			continue // no holder, or not readable: said as none
		}
		lost[i].Holder = string(e.Value())
	}
}

// dumpReplicas writes, for each running replica, its metrics
// (<id>-metrics.txt) and, when it serves profiles (not in a partition
// lab), its goroutines (<id>-goroutines.txt) into the work dir.
func (r *chaosRun) dumpReplicas(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	c := &http.Client{Timeout: 10 * time.Second}
	var kept []string
	for _, p := range r.replicas {
		dumps := []struct{ name, url string }{{"metrics", "http://" + p.httpAddr + "/metrics"}}
		if p.pprofAddr != "" {
			dumps = append(dumps, struct{ name, url string }{"goroutines", "http://" + p.pprofAddr + "/debug/pprof/goroutine?debug=2"})
		}
		for _, d := range dumps {
			path := filepath.Join(r.work.dir, p.id+"-"+d.name+".txt")
			if err := fetchTo(ctx, c, d.url, path); err != nil {
				r.progress("%s of %s not kept: %v", d.name, p.id, err)
				continue
			}
			kept = append(kept, filepath.Base(path))
		}
	}
	if len(kept) > 0 {
		r.progress("kept for the loss: %s", strings.Join(kept, ", "))
	}
}
