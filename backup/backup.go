// Package backup backs up and restores every stream, KV bucket and object
// store chime keeps (engine.Inventory), each with JetStream's snapshot API
// through jsm.go, into a directory with a manifest.
//
// A backup directory holds manifest.json and a directory per stream (a
// bucket X is the stream KV_X, an object store X is OBJ_X) with jsm.go's
// backup.json (the stream's configuration and state) and its archive. The
// manifest, written last, names each with its configuration, message
// count, last sequence and the SHA-256 of its files: a directory without
// one is a backup that did not finish.
package backup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	"github.com/chime-nats/chime/partitions"
)

// Format is the manifest format this version writes and the newest it
// reads.
const Format = 1

// ManifestFile is the manifest's name in a backup directory.
const ManifestFile = "manifest.json"

// apiTimeout bounds each JetStream API request and restore chunk.
const apiTimeout = 30 * time.Second

// Manifest describes a backup.
type Manifest struct {
	Format        int       `json:"format"`
	ChimeVersion  string    `json:"chime_version"`
	CreatedAt     time.Time `json:"created_at"`
	ServerVersion string    `json:"server_version"`
	// Layout is the record layout of the store backed up (CHIME_PARTITIONS,
	// CHIME_SHARDS): the chime that restores it must be configured alike.
	Layout  Layout   `json:"layout"`
	Streams []Stream `json:"streams"`
	// Skipped are the resources of the list left out, and why.
	Skipped []Skipped `json:"skipped,omitempty"`
}

// Layout is partitions.Layout in the manifest.
type Layout struct {
	Partitions int `json:"partitions"`
	Shards     int `json:"shards"`
}

// Stream is one stream backed up.
type Stream struct {
	Stream string      `json:"stream"`
	Kind   engine.Kind `json:"kind"`
	// Name is the bucket's, the store's or the stream's name.
	Name string `json:"name"`
	// Dir is its directory, relative to the backup's.
	Dir string `json:"dir"`
	// Listed is false for a stream named like chime's that the list of
	// this version does not have (backed up all the same).
	Listed   bool            `json:"listed"`
	Config   json.RawMessage `json:"config"`
	Messages uint64          `json:"messages"`
	Bytes    uint64          `json:"bytes"`
	FirstSeq uint64          `json:"first_seq"`
	LastSeq  uint64          `json:"last_seq"`
	// Consumers is how many consumers the snapshot holds (with their
	// positions).
	Consumers int `json:"consumers"`
	// SHA256 is each file's checksum, by name.
	SHA256 map[string]string `json:"sha256"`
}

// Skipped is a resource of the list a backup leaves out.
type Skipped struct {
	Stream string `json:"stream"`
	Why    string `json:"why"`
}

// Options configure Backup.
type Options struct {
	// Out is the directory written: absent or empty.
	Out          string
	ChimeVersion string
	Log          *slog.Logger
}

// chimeNamed reports whether a stream is named like chime's.
func chimeNamed(stream string) bool {
	for _, p := range []string{"CHIME_", "KV_chime_", "OBJ_chime_"} {
		if strings.HasPrefix(stream, p) {
			return true
		}
	}
	return false
}

// logger is l, or one that discards.
func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// Plan is what a backup of the store nc reaches takes: chime's list for
// the layout the store records, the streams of the list it lacks, and
// the streams named like chime's that the list does not have.
func Plan(ctx context.Context, nc *nats.Conn) (layout partitions.Layout, list []engine.Resource, missing, extra []string, err error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return layout, nil, nil, nil, fmt.Errorf("backup: %w", err)
	}
	timers, err := js.KeyValue(ctx, engine.TimersBucket)
	if err != nil {
		return layout, nil, nil, nil, fmt.Errorf("backup: chime's %s bucket: %w (is this chime's NATS account, and has chime started on it once?)", engine.TimersBucket, err)
	}
	if layout, err = partitions.Stored(ctx, timers); err != nil {
		return layout, nil, nil, nil, fmt.Errorf("backup: %w", err)
	}
	present := map[string]bool{}
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		present[name] = true
	}
	if err := names.Err(); err != nil {
		return layout, nil, nil, nil, fmt.Errorf("backup: list the streams: %w", err)
	}
	list = engine.Inventory(engine.Topology{Layout: layout})
	listed := map[string]bool{}
	for _, r := range list {
		listed[r.Stream] = true
		if !present[r.Stream] && r.Transient == "" {
			missing = append(missing, r.Stream)
		}
	}
	for name := range present {
		if chimeNamed(name) && !listed[name] {
			extra = append(extra, name)
		}
	}
	slices.Sort(extra)
	return layout, list, missing, extra, nil
}

// Backup snapshots every stream of chime's list (but the transient ones)
// and every other stream named like chime's into o.Out, then writes the
// manifest. It refuses a directory that is not empty.
func Backup(ctx context.Context, nc *nats.Conn, o Options) (*Manifest, error) {
	log := logger(o.Log)
	if err := emptyDir(o.Out); err != nil {
		return nil, err
	}
	layout, list, missing, extra, err := Plan(ctx, nc)
	if err != nil {
		return nil, err
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("backup: chime's %s missing from the server: has this version of chime started on it? (its start makes them)", strings.Join(missing, ", "))
	}
	mgr, err := jsm.New(nc, jsm.WithTimeout(apiTimeout))
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	if err := os.MkdirAll(o.Out, 0o700); err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	m := &Manifest{
		Format: Format, ChimeVersion: o.ChimeVersion, CreatedAt: time.Now().UTC(), ServerVersion: nc.ConnectedServerVersion(),
		Layout: Layout(layout),
	}
	type todo struct {
		stream, name string
		kind         engine.Kind
		listed       bool
	}
	var all []todo
	for _, r := range list {
		if r.Transient != "" {
			m.Skipped = append(m.Skipped, Skipped{Stream: r.Stream, Why: r.Transient})
			continue
		}
		all = append(all, todo{r.Stream, r.Name, r.Kind, true})
	}
	for _, s := range extra {
		log.Warn("not in chime's list of streams: backed up all the same", "stream", s)
		all = append(all, todo{stream: s, name: s, kind: engine.KindStream})
	}
	for _, t := range all {
		start := time.Now()
		s, err := snapshot(ctx, mgr, o.Out, t.stream)
		if err != nil {
			return nil, err
		}
		s.Kind, s.Name, s.Listed = t.kind, t.name, t.listed
		m.Streams = append(m.Streams, *s)
		log.Info("backed up", "stream", s.Stream, "messages", s.Messages, "last_seq", s.LastSeq, "bytes", s.Bytes, "took", time.Since(start).Round(time.Millisecond))
	}
	if err := writeManifest(o.Out, m); err != nil {
		return nil, err
	}
	return m, nil
}

// snapshot backs one stream up into out/<stream>, consumers included (the
// durable ones' positions are what keeps events from being handled again
// after a restore).
func snapshot(ctx context.Context, mgr *jsm.Manager, out, stream string) (*Stream, error) {
	str, err := mgr.LoadStream(stream)
	if err != nil {
		return nil, fmt.Errorf("backup: %s: %w", stream, err)
	}
	dir := filepath.Join(out, stream)
	if _, err := str.SnapshotToDirectory(ctx, dir, jsm.SnapshotConsumers()); err != nil {
		return nil, fmt.Errorf("backup: snapshot %s: %w", stream, err)
	}
	meta, err := readMeta(dir)
	if err != nil {
		return nil, fmt.Errorf("backup: %s: %w", stream, err)
	}
	sums, err := checksums(dir)
	if err != nil {
		return nil, fmt.Errorf("backup: %s: %w", stream, err)
	}
	return &Stream{
		Stream: stream, Dir: stream, Config: meta.Config, Messages: meta.State.Msgs, Bytes: meta.State.Bytes,
		FirstSeq: meta.State.FirstSeq, LastSeq: meta.State.LastSeq, Consumers: meta.State.Consumers, SHA256: sums,
	}, nil
}

// meta is jsm.go's backup.json.
type meta struct {
	Config json.RawMessage `json:"config"`
	State  struct {
		Msgs      uint64 `json:"messages"`
		Bytes     uint64 `json:"bytes"`
		FirstSeq  uint64 `json:"first_seq"`
		LastSeq   uint64 `json:"last_seq"`
		Consumers int    `json:"consumer_count"`
	} `json:"state"`
}

func readMeta(dir string) (*meta, error) {
	b, err := os.ReadFile(filepath.Join(dir, jsm.SnapshotMetaFile))
	if err != nil {
		return nil, err
	}
	var m meta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", jsm.SnapshotMetaFile, err)
	}
	return &m, nil
}

// checksums are the SHA-256 of every file in dir, by name.
func checksums(dir string) (map[string]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		sum, err := fileSum(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out[e.Name()] = sum
	}
	return out, nil
}

func fileSum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// emptyDir refuses a path that is a file or a directory with anything in it.
func emptyDir(dir string) error {
	if dir == "" {
		return errors.New("backup: no output directory")
	}
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("backup: %w", err)
	case len(entries) > 0:
		return fmt.Errorf("backup: %s is not empty: a backup never overwrites one; give a new directory", dir)
	}
	return nil
}

// writeManifest writes m last, by rename, so that a manifest is there only
// when every stream is.
func writeManifest(dir string, m *Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("backup: manifest: %w", err)
	}
	tmp := filepath.Join(dir, ManifestFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("backup: manifest: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, ManifestFile)); err != nil {
		return fmt.Errorf("backup: manifest: %w", err)
	}
	return nil
}
