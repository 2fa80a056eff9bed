package access

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nkeys"
)

// Key files that `chime nats-config` writes.
const (
	UserKeyFile      = "chime-user.nk"      // chime's own connections: CHIME_NATS_NKEY_FILE
	CalloutKeyFile   = "chime-callout.nk"   // signs admitted users: CHIME_NATS_CALLOUT_KEY_FILE
	ResponderKeyFile = "chime-responder.nk" // answers requests: CHIME_NATS_RESPONDER_NKEY_FILE
	SystemKeyFile    = "chime-system.nk"    // ends revoked sessions: CHIME_NATS_SYSTEM_NKEY_FILE
)

// ServerKeys are the public halves of chime's keys.
type ServerKeys struct {
	User   string // U...: chime's service user, exempt from the callout
	Issuer string // A...: the callout's issuer
	// Responder (U...) serves the requests and may publish only replies
	// into inboxes, exempt from the callout.
	Responder string
	// System (U...) is chime's user in the system account, which asks the
	// servers to disconnect a revoked token's clients.
	System string
}

// EnsureKeys writes chime's user and callout seeds into dir (mode 0600),
// keeping seeds already there, and returns their public keys. The seeds
// are secrets: they are never printed.
func EnsureKeys(dir string) (ServerKeys, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return ServerKeys{}, fmt.Errorf("access: keys: %w", err)
	}
	user, err := ensureKey(filepath.Join(dir, UserKeyFile), nkeys.CreateUser)
	if err != nil {
		return ServerKeys{}, err
	}
	issuer, err := ensureKey(filepath.Join(dir, CalloutKeyFile), nkeys.CreateAccount)
	if err != nil {
		return ServerKeys{}, err
	}
	responder, err := ensureKey(filepath.Join(dir, ResponderKeyFile), nkeys.CreateUser)
	if err != nil {
		return ServerKeys{}, err
	}
	system, err := ensureKey(filepath.Join(dir, SystemKeyFile), nkeys.CreateUser)
	if err != nil {
		return ServerKeys{}, err
	}
	return ServerKeys{User: user, Issuer: issuer, Responder: responder, System: system}, nil
}

func ensureKey(path string, create func() (nkeys.KeyPair, error)) (string, error) {
	if b, err := os.ReadFile(path); err == nil {
		kp, err := nkeys.ParseDecoratedNKey(b)
		if err != nil {
			return "", fmt.Errorf("access: %s: not an nkey seed", path)
		}
		return kp.PublicKey()
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("access: keys: %w", err)
	}
	kp, err := create()
	if err != nil {
		return "", fmt.Errorf("access: keys: %w", err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return "", fmt.Errorf("access: keys: %w", err)
	}
	if err := os.WriteFile(path, append(seed, '\n'), 0o600); err != nil {
		return "", fmt.Errorf("access: keys: %w", err)
	}
	return kp.PublicKey()
}

// ServerConfig is the authorization block every nats-server of the
// cluster needs: chime's user and its responder, both exempt from the
// callout, the callout that decides every other connection by its token,
// and chime's user in the system account, through which a revocation
// disconnects the revoked token's clients.
func ServerConfig(k ServerKeys, rights Rights) string {
	return fmt.Sprintf(`# chime: NATS authorization through chime's auth callout (CHIME_NATS_AUTH=true).
# chime connects as the nkey user below (CHIME_NATS_NKEY_FILE=%[3]s),
# answers requests as its responder (CHIME_NATS_RESPONDER_NKEY_FILE=%[6]s),
# which may publish only replies into inboxes, and signs the users it admits
# with the issuer's seed (CHIME_NATS_CALLOUT_KEY_FILE=%[4]s). Its user in the
# system account (CHIME_NATS_SYSTEM_NKEY_FILE=%[10]s) disconnects the clients
# of a revoked token; if your servers have a system account already, add that
# user to it instead of the accounts block below.
# Every other client connects with a token (nats --token): an operator token,
# an agent token (chime agent token) or a callback token, and gets exactly
# that principal's permissions.
authorization {
  timeout: 2
  users: [
    { nkey: %[1]q }
    { nkey: %[5]q, permissions: { publish: { allow: [%[7]s] }, subscribe: { allow: [%[8]s] } } }
  ]
  auth_callout {
    issuer: %[2]q
    auth_users: [ %[1]q, %[5]q, %[9]q ]
  }
}
system_account: SYS
accounts {
  SYS: { users: [ { nkey: %[9]q } ] }
}
`, k.User, k.Issuer, UserKeyFile, CalloutKeyFile, k.Responder, ResponderKeyFile,
		quoteAll(ResponderPublish()), quoteAll(ResponderSubscribe(rights)), k.System, SystemKeyFile)
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}
