package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/backup"
	"github.com/chime-nats/chime/engine"
)

const backupUsage = `Usage:
  chime backup --out DIR [--data-dir DIR] [--nkey FILE] [--token T]
  chime restore --from DIR [--replace] [--data-dir DIR] [--nkey FILE] [--token T]

backup snapshots every stream, KV bucket and object store chime keeps (the list is
chime's own, for the record layout the store holds; docs/runbook.md shows it) into
DIR, a new or empty directory, with manifest.json. restore puts them back, with every
chime replica stopped: it refuses streams that exist unless --replace deletes them
first. Progress goes to stderr, a JSON summary to stdout.

They connect to CHIME_NATS_URL (CHIME_NATS_CREDS, CHIME_NATS_TOKEN or --token, the
service user's nkey seed CHIME_NATS_NKEY_FILE or --nkey: a user that may use the
JetStream API, which agents' and operators' tokens may not). With --data-dir, chime
being stopped, they run an embedded server on that data dir (CHIME_DATA_DIR) instead
and connect to it in-process.
`

// backupCommand runs `chime backup` and `chime restore`.
func (a *App) backupCommand(ctx context.Context, args []string) error {
	cmd := args[0]
	fs := newFlagSet(a, cmd)
	fs.Usage = func() { fmt.Fprint(a.Stdout, backupUsage) }
	out := fs.String("out", "", "directory to write the backup into: new, or empty (backup)")
	from := fs.String("from", "", "backup directory to restore (restore)")
	replace := fs.Bool("replace", false, "delete the backup's streams that exist, then restore them (restore)")
	dataDir := fs.String("data-dir", "", "chime's data dir: run an embedded server on it rather than connect (chime stopped)")
	nkey := fs.String("nkey", os.Getenv("CHIME_NATS_NKEY_FILE"), "nkey seed file of a user that may use the JetStream API (default CHIME_NATS_NKEY_FILE)")
	pos, err := parseInterspersed(fs, args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	switch {
	case err != nil:
		return fmt.Errorf("%w: %w", ErrUsage, err)
	case len(pos) > 0:
		return fmt.Errorf("%w: chime %s takes no arguments, only flags", ErrUsage, cmd)
	case cmd == "backup" && (*out == "" || *from != "" || *replace):
		return fmt.Errorf("%w: chime backup --out DIR", ErrUsage)
	case cmd == "restore" && (*from == "" || *out != ""):
		return fmt.Errorf("%w: chime restore --from DIR [--replace]", ErrUsage)
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(a.Stderr, nil))
	if cmd == "restore" {
		// Check the backup before anything is started or connected.
		if _, err := backup.ReadManifest(*from); err != nil {
			return err
		}
	}
	// A user the JetStream API is not allowed to is refused by the server
	// with a permissions violation, and never answered: say so at once.
	ctx, refuse := context.WithCancelCause(ctx)
	defer refuse(nil)
	nc, closeConn, err := a.backupConn(ctx, *dataDir, *nkey, log, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			refuse(err)
		}
	}))
	if err != nil {
		return err
	}
	defer closeConn()
	refused := func(err error) error {
		if cause := context.Cause(ctx); errors.Is(cause, nats.ErrPermissionViolation) {
			return fmt.Errorf("%s refused: this user may not use the JetStream API (agents' and operators' tokens may not): "+
				"connect as chime's service user (--nkey, CHIME_NATS_NKEY_FILE), or stop chime and use --data-dir: %w", cmd, cause)
		}
		return err
	}
	start := time.Now()
	if cmd == "backup" {
		m, err := backup.Backup(ctx, nc, backup.Options{Out: *out, ChimeVersion: a.Version, Log: log})
		if err != nil {
			return refused(err)
		}
		return a.printJSON(backupSummary(*out, m, time.Since(start)))
	}
	restored, m, err := backup.Restore(ctx, nc, backup.RestoreOptions{From: *from, Replace: *replace, Log: log})
	if err != nil {
		err = refused(err)
		if len(restored) > 0 {
			log.Error("restore stopped part way: the streams listed restored, the others not", "restored", len(restored))
		}
		return err
	}
	var msgs uint64
	for _, r := range restored {
		msgs += r.Messages
	}
	log.Info("restore done: start chime (its start updates the restored streams' settings to its configuration)")
	return a.printJSON(map[string]any{
		"from": *from, "backup_chime_version": m.ChimeVersion, "backup_created_at": m.CreatedAt, "layout": m.Layout,
		"streams": len(restored), "messages": msgs, "took_ms": time.Since(start).Milliseconds(), "restored": restored,
	})
}

// backupSummary is what `chime backup` prints.
func backupSummary(out string, m *backup.Manifest, took time.Duration) map[string]any {
	var msgs uint64
	type stream struct {
		Stream   string `json:"stream"`
		Messages uint64 `json:"messages"`
		LastSeq  uint64 `json:"last_seq"`
	}
	streams := make([]stream, 0, len(m.Streams))
	for _, s := range m.Streams {
		msgs += s.Messages
		streams = append(streams, stream{s.Stream, s.Messages, s.LastSeq})
	}
	var size int64
	_ = filepath.WalkDir(out, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				size += fi.Size()
			}
		}
		return nil
	})
	return map[string]any{
		"out": out, "manifest": filepath.Join(out, backup.ManifestFile), "layout": m.Layout, "streams": len(m.Streams),
		"messages": msgs, "bytes": size, "took_ms": took.Milliseconds(), "skipped": m.Skipped, "backed_up": streams,
	}
}

// backupConn connects as the other commands do (plus the nkey), or runs
// an embedded server on dataDir and connects to it in-process.
func (a *App) backupConn(ctx context.Context, dataDir, nkey string, log *slog.Logger, opts ...nats.Option) (*nats.Conn, func(), error) {
	if dataDir == "" {
		if nkey != "" {
			opt, err := nats.NkeyOptionFromSeed(nkey)
			if err != nil {
				return nil, nil, fmt.Errorf("nkey: %w", err)
			}
			opts = append(opts, opt)
		}
		nc, err := a.connect(opts...)
		if err != nil {
			return nil, nil, err
		}
		return nc, nc.Close, nil
	}
	if _, err := os.Stat(dataDir); err != nil {
		return nil, nil, fmt.Errorf("the data dir: %w", err)
	}
	// Quiet: the server's log is for its failures, which StartEmbedded
	// returns.
	quiet := slog.New(slog.NewTextHandler(a.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	ns, err := engine.StartEmbedded(ctx, engine.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: dataDir}, quiet)
	if err != nil {
		return nil, nil, err
	}
	nc, err := engine.Connect(engine.ConnectOptions{Embedded: ns, Name: "chime backup"}, quiet)
	if err != nil {
		ns.Shutdown()
		return nil, nil, err
	}
	log.Info("embedded server started on the data dir", "data_dir", dataDir)
	return nc, func() {
		nc.Close()
		ns.Shutdown()
		ns.WaitForShutdown()
	}, nil
}
