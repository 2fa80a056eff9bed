package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jsm.go"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/engine"
)

// presencePrefix keys a running replica's presence in the leases bucket
// (the scheduler's).
const presencePrefix = "replica."

// RestoreOptions configure Restore.
type RestoreOptions struct {
	// From is the backup directory.
	From string
	// Replace deletes a stream of the backup that exists before restoring
	// it; without it, any that exists refuses the whole restore.
	Replace bool
	Log     *slog.Logger
}

// Restored is one stream restored.
type Restored struct {
	Stream   string `json:"stream"`
	Replaced bool   `json:"replaced,omitempty"`
	Messages uint64 `json:"messages"`
	LastSeq  uint64 `json:"last_seq"`
	Bytes    uint64 `json:"bytes"`
	Millis   int64  `json:"ms"`
}

// ReadManifest reads and checks a backup directory's manifest, and the
// checksum of every file it names.
func ReadManifest(dir string) (*Manifest, error) {
	if st, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("restore: the backup directory: %w", err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("restore: %s is not a directory", dir)
	}
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("restore: %s has no %s: not a chime backup, or one that did not finish", dir, ManifestFile)
	}
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("restore: %s: %w", ManifestFile, err)
	}
	switch {
	case m.Format > Format:
		return nil, fmt.Errorf("restore: the backup's manifest is format %d (chime %s), newer than this chime reads (%d): restore with that version or newer", m.Format, m.ChimeVersion, Format)
	case m.Format < 1:
		return nil, fmt.Errorf("restore: %s has no format: not a chime backup manifest", ManifestFile)
	}
	for _, s := range m.Streams {
		if s.Dir == "" || filepath.IsAbs(s.Dir) || strings.Contains(s.Dir, "..") {
			return nil, fmt.Errorf("restore: %s: stream %s has directory %q, not one inside the backup", ManifestFile, s.Stream, s.Dir)
		}
		if len(s.SHA256) == 0 {
			return nil, fmt.Errorf("restore: %s: stream %s lists no files", ManifestFile, s.Stream)
		}
		for name, want := range s.SHA256 {
			got, err := fileSum(filepath.Join(dir, s.Dir, filepath.Base(name)))
			if errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("restore: stream %s: %s is missing from the backup", s.Stream, filepath.Join(s.Dir, name))
			}
			if err != nil {
				return nil, fmt.Errorf("restore: stream %s: %w", s.Stream, err)
			}
			if got != want {
				return nil, fmt.Errorf("restore: stream %s: %s does not match its checksum: the backup is damaged", s.Stream, filepath.Join(s.Dir, name))
			}
		}
	}
	return &m, nil
}

// Restore restores every stream of the backup in o.From, in the
// manifest's order, and checks each one's message count and last
// sequence against the manifest. Nothing is changed when the backup does
// not check out, a chime replica is running on the server, or a stream
// exists (without o.Replace).
func Restore(ctx context.Context, nc *nats.Conn, o RestoreOptions) ([]Restored, *Manifest, error) {
	log := logger(o.Log)
	m, err := ReadManifest(o.From)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, fmt.Errorf("restore: %w", err)
	}
	if running, err := replicas(ctx, js); err != nil {
		return nil, nil, err
	} else if len(running) > 0 {
		return nil, nil, fmt.Errorf("restore: chime replicas are running on this server (%s): stop them first (scale to 0), "+
			"as they re-create what a restore deletes; a replica killed shows here for its lease TTL", strings.Join(running, ", "))
	}
	present := map[string]bool{}
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		present[name] = true
	}
	if err := names.Err(); err != nil {
		return nil, nil, fmt.Errorf("restore: list the streams: %w", err)
	}
	var exist []string
	for _, s := range m.Streams {
		if present[s.Stream] {
			exist = append(exist, s.Stream)
		}
	}
	if len(exist) > 0 && !o.Replace {
		return nil, nil, fmt.Errorf("restore: %s already exist: restore into a store without them, or --replace to delete them and restore the backup's", strings.Join(exist, ", "))
	}
	mgr, err := jsm.New(nc, jsm.WithTimeout(apiTimeout))
	if err != nil {
		return nil, nil, fmt.Errorf("restore: %w", err)
	}
	var out []Restored
	for _, s := range m.Streams {
		start := time.Now()
		r := Restored{Stream: s.Stream, Replaced: present[s.Stream]}
		if r.Replaced {
			if err := js.DeleteStream(ctx, s.Stream); err != nil {
				return out, m, fmt.Errorf("restore: delete %s to replace it: %w", s.Stream, err)
			}
		}
		_, state, err := mgr.RestoreSnapshotFromDirectory(ctx, s.Stream, filepath.Join(o.From, s.Dir))
		if err != nil {
			return out, m, fmt.Errorf("restore: %s: %w", s.Stream, err)
		}
		if state.Msgs != s.Messages || state.LastSeq != s.LastSeq {
			return out, m, fmt.Errorf("restore: %s restored with %d messages to sequence %d, the backup had %d to %d",
				s.Stream, state.Msgs, state.LastSeq, s.Messages, s.LastSeq)
		}
		r.Messages, r.LastSeq, r.Bytes, r.Millis = state.Msgs, state.LastSeq, state.Bytes, time.Since(start).Milliseconds()
		out = append(out, r)
		log.Info("restored", "stream", s.Stream, "messages", r.Messages, "last_seq", r.LastSeq, "replaced", r.Replaced, "took", time.Since(start).Round(time.Millisecond))
	}
	return out, m, nil
}

// replicas are the chime replicas whose presence the leases bucket holds.
func replicas(ctx context.Context, js jetstream.JetStream) ([]string, error) {
	kv, err := js.KeyValue(ctx, engine.LeasesBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("restore: read the leases: %w", err)
	}
	keys, err := kv.ListKeysFiltered(ctx, presencePrefix+"*")
	if err != nil {
		return nil, fmt.Errorf("restore: read the leases: %w", err)
	}
	var out []string
	for k := range keys.Keys() {
		out = append(out, strings.TrimPrefix(k, presencePrefix))
	}
	slices.Sort(out)
	return out, nil
}
