package cli

import (
	"flag"
	"fmt"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/api"
)

// natsConfig runs `chime nats-config --dir DIR`: it writes chime's keys
// into DIR (kept if there) and prints the servers' authorization block.
func (a *App) natsConfig(args []string) error {
	fs := flag.NewFlagSet("nats-config", flag.ContinueOnError)
	fs.SetOutput(a.Stderr)
	dir := fs.String("dir", "", "directory for chime's NATS key seeds (created, mode 0700)")
	if pos, err := parseInterspersed(fs, args); err != nil || len(pos) != 0 || *dir == "" {
		return fmt.Errorf("%w: chime nats-config --dir DIR", ErrUsage)
	}
	keys, err := access.EnsureKeys(*dir)
	if err != nil {
		return err
	}
	_, err = fmt.Fprint(a.Stdout, access.ServerConfig(keys, api.Rights()))
	return err
}
