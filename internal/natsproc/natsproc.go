// Package natsproc runs real nats-server processes for fault tests and for
// the benches (chaos, scale, inbox, ...): a standalone server or a JetStream
// cluster on 127.0.0.1 (or on given hosts, wrapped in a command such as
// ip netns exec), killed with SIGKILL and restarted on the same store.
// Every call returns an error; tests that want t.Fatal use the natsproctest
// adapter.
package natsproc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Bounds on every wait, so a wedged server fails the test instead of hanging it.
const (
	buildTimeout = 5 * time.Minute // a cold build of nats-server takes about a minute
	readyTimeout = 20 * time.Second
	stopTimeout  = 20 * time.Second // graceful shutdown flushes JetStream
	killTimeout  = 10 * time.Second
)

// serverPkg is built from the module's own go.mod, so the binary is the
// nats-server version chime is tested against.
const serverPkg = "github.com/nats-io/nats-server/v2"

// ErrNoLeader is returned when a stream has no elected leader right now.
var ErrNoLeader = errors.New("natsproc: no leader")

type binary struct {
	path string
	note string // why the fallback was used, empty after a successful build
}

// build runs at most once per process: linking nats-server costs about a
// second even with a warm build cache.
var build = sync.OnceValues(buildBinary)

// errNoModule: the process does not run inside a Go module (no go.mod above
// its working directory, or no go tool), so nats-server cannot be built.
var errNoModule = errors.New("not run from inside the chime module, so no nats-server can be built from its go.mod")

// Binary returns the path of a nats-server binary: $NATS_SERVER_BIN if set,
// else one built from the module's go.mod once per process (in the repo),
// else nats-server from PATH (outside the module, or when the build fails).
func Binary() (string, error) {
	b, err := findBinary()
	return b.path, err
}

// findBinary is Binary with the note of a fallback.
func findBinary() (binary, error) {
	if p := os.Getenv("NATS_SERVER_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return binary{}, fmt.Errorf("natsproc: NATS_SERVER_BIN: %w", err)
		}
		return binary{path: p}, nil
	}
	b, err := build()
	if err != nil {
		return binary{}, fmt.Errorf("natsproc: %w", err)
	}
	return b, nil
}

func buildBinary() (binary, error) {
	p, buildErr := goBuild()
	if buildErr == nil {
		return binary{path: p}, nil
	}
	if p, err := exec.LookPath("nats-server"); err == nil {
		return binary{path: p, note: fmt.Sprintf("using nats-server from PATH, %s: %v", p, buildErr)}, nil
	}
	if errors.Is(buildErr, errNoModule) {
		return binary{}, fmt.Errorf("no nats-server: %w; set NATS_SERVER_BIN to a nats-server binary or put nats-server in PATH", buildErr)
	}
	return binary{}, fmt.Errorf("no nats-server (set NATS_SERVER_BIN or put one in PATH): %w", buildErr)
}

// goBuild builds nats-server into a directory of the user cache keyed by the
// module root: per-process temp dirs would leak 25 MB per run, and a shared
// name would let worktrees on other nats-server versions swap binaries under
// each other. The build goes to a private dir and is renamed into place, so
// test processes building concurrently never exec a half-written file.
func goBuild() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	// go test puts its own GOROOT/bin first in PATH, so in a test this is the
	// go that runs it.
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("%w (no go tool: %w)", errNoModule, err)
	}
	out, err := exec.CommandContext(ctx, goTool, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		wd, _ := os.Getwd()
		return "", fmt.Errorf("%w (no go.mod in %s or above)", errNoModule, wd)
	}
	root := filepath.Dir(gomod)

	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	sum := sha256.Sum256([]byte(root))
	dir := filepath.Join(cache, "chime-natsproc", hex.EncodeToString(sum[:8]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("build dir: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", fmt.Errorf("build dir: %w", err)
	}
	defer os.RemoveAll(tmp)

	cmd := exec.CommandContext(ctx, goTool, "build", "-o", filepath.Join(tmp, "nats-server"), serverPkg)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s in %s: %w\n%s", serverPkg, root, err, bytes.TrimSpace(out))
	}
	final := filepath.Join(dir, "nats-server")
	if err := os.Rename(filepath.Join(tmp, "nats-server"), final); err != nil {
		return "", fmt.Errorf("install nats-server: %w", err)
	}
	return final, nil
}

// FreePorts returns n distinct TCP ports free on 127.0.0.1. They are drawn
// below the kernel's ephemeral range when it is known, so that outgoing
// connections (routes and clients reconnecting to a killed server) cannot
// take a port while its server is down between a Kill and a Restart.
func FreePorts(n int) ([]int, error) {
	lo, hi := portRange()
	// Hold every listener until all are picked, so no port is returned twice.
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for attempt := 0; len(ports) < n; attempt++ {
		if attempt >= 100*n {
			return nil, fmt.Errorf("natsproc: no free port on 127.0.0.1 after %d attempts", attempt)
		}
		addr := "127.0.0.1:0"
		if hi > lo {
			addr = fmt.Sprintf("127.0.0.1:%d", lo+rand.IntN(hi-lo))
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		held = append(held, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// portRange is [10000, start of the ephemeral range), or empty when the range
// cannot be read, in which case the kernel picks.
func portRange() (lo, hi int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0
	}
	var first, last int
	if _, err := fmt.Sscan(string(b), &first, &last); err != nil || first <= 11000 {
		return 0, 0
	}
	return 10000, first
}
