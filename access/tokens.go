package access

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/secret"
	"github.com/chime-nats/chime/subjects"
)

// OperatorTokens holds the SHA-256 hashes of the operator tokens
// (CHIME_OPERATOR_TOKENS_FILE); the tokens themselves are never on disk.
type OperatorTokens struct {
	hashes [][sha256.Size]byte
}

// LoadOperatorTokens reads a file of hex SHA-256 token hashes, one per
// line; blank lines and lines starting with # are skipped. An error names
// the line, never its content.
func LoadOperatorTokens(path string) (*OperatorTokens, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("access: operator tokens: %w", err)
	}
	defer f.Close()
	o := &OperatorTokens{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		b, err := hex.DecodeString(line)
		if err != nil || len(b) != sha256.Size {
			return nil, fmt.Errorf("access: operator tokens: %s line %d: not a hex SHA-256 (64 hex digits)", path, n)
		}
		o.hashes = append(o.hashes, [sha256.Size]byte(b))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("access: operator tokens: %w", err)
	}
	if len(o.hashes) == 0 {
		return nil, fmt.Errorf("access: operator tokens: %s holds no token hash", path)
	}
	return o, nil
}

// Enabled reports whether operator tokens are configured.
func (o *OperatorTokens) Enabled() bool { return o != nil && len(o.hashes) > 0 }

// Match checks token against every hash, without stopping at the first
// match, so the time says nothing about which.
func (o *OperatorTokens) Match(token string) bool {
	if !o.Enabled() || token == "" {
		return false
	}
	h := sha256.Sum256([]byte(token))
	match := 0
	for i := range o.hashes {
		match |= subtle.ConstantTimeCompare(h[:], o.hashes[i][:])
	}
	return match == 1
}

// AgentTokenPrefix marks chime agent tokens, so secret scanners find them.
const AgentTokenPrefix = "chime_at_"

// ErrUnknownToken is a token that names no one: never issued, revoked, or
// mistyped. Callers do not say which.
var ErrUnknownToken = errors.New("access: unknown token")

// AgentToken is what is stored of an issued agent token: never the token.
type AgentToken struct {
	AgentID   string    `json:"agent_id"`
	TokenID   string    `json:"token_id"` // the hash's first 12 hex digits, to name it in lists and logs
	CreatedAt time.Time `json:"created_at"`
}

// IssuedToken is the reply to an issue: the token, shown this once.
type IssuedToken struct {
	AgentToken
	Token string `json:"token"`
}

// RevokedTokens is the reply to a revoke.
type RevokedTokens struct {
	AgentID string `json:"agent_id"`
	Revoked int    `json:"revoked"`
}

// Tokens issues, resolves and revokes agent tokens in the tokens bucket:
// tok.<sha256> holds the AgentToken, agt.<agent>.<token_id> the hash, so
// that all of an agent's tokens can be revoked without reading the others'.
type Tokens struct {
	kv       jetstream.KeyValue
	nc       *nats.Conn // reads the bucket's leader; nil: a KV get
	markers  time.Duration
	now      func() time.Time
	onRevoke func(ctx context.Context, agentID string)
}

// NewTokens returns the agent token store over the tokens bucket. A
// revoke's deletion markers expire after markers (the bucket's
// LimitMarkerTTL; zero keeps them). With nc, lookups read the bucket's
// leader (kvrec.LeaderLast): a KV get may be answered by a follower that
// lags a revoke, or by one on the minority side of a partition.
func NewTokens(kv jetstream.KeyValue, nc *nats.Conn, markers time.Duration, now func() time.Time) *Tokens {
	if now == nil {
		now = time.Now
	}
	return &Tokens{kv: kv, nc: nc, markers: markers, now: now}
}

// OnRevoke sets what runs after each revocation of an agent's tokens:
// ending its open connections and streams.
func (t *Tokens) OnRevoke(fn func(ctx context.Context, agentID string)) { t.onRevoke = fn }

func tokKey(hash string) string             { return "tok." + hash }
func agtKey(agentID, tokenID string) string { return "agt." + agentID + "." + tokenID }
func agtFilter(agentID string) string       { return "agt." + agentID + ".*" }

// Issue makes a new token for agentID. The agent's other tokens stay valid.
func (t *Tokens) Issue(ctx context.Context, agentID string) (*IssuedToken, error) {
	if err := subjects.ValidateID("agent_id", agentID); err != nil {
		return nil, err
	}
	token := secret.NewToken(AgentTokenPrefix)
	hash := secret.Hash(token)
	rec := AgentToken{AgentID: agentID, TokenID: hash[:12], CreatedAt: t.now().UTC()}
	// The agent's index entry first: a token is never valid without the
	// entry a revoke finds it by.
	if _, _, err := kvrec.Create(ctx, t.kv, agtKey(agentID, rec.TokenID), &hash, func(h *string) bool { return *h == hash }); err != nil {
		return nil, fmt.Errorf("access: issue token: %w", err)
	}
	if _, _, err := kvrec.Create(ctx, t.kv, tokKey(hash), &rec, func(r *AgentToken) bool { return *r == rec }); err != nil {
		return nil, fmt.Errorf("access: issue token: %w", err)
	}
	return &IssuedToken{AgentToken: rec, Token: token}, nil
}

// Lookup resolves an agent token: ErrUnknownToken when it names no one.
// It reads the bucket each time, so a revoke is seen by the next connect.
func (t *Tokens) Lookup(ctx context.Context, token string) (*AgentToken, error) {
	if !strings.HasPrefix(token, AgentTokenPrefix) || len(token) > 256 {
		return nil, ErrUnknownToken
	}
	key := tokKey(secret.Hash(token))
	if t.nc == nil {
		rec, _, err := kvrec.Get[AgentToken](ctx, t.kv, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, ErrUnknownToken
		}
		if err != nil {
			return nil, fmt.Errorf("access: token lookup: %w", err)
		}
		return rec, nil
	}
	last, err := kvrec.LeaderLast(ctx, t.nc, t.kv.Bucket(), key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, ErrUnknownToken
	}
	if err != nil {
		return nil, fmt.Errorf("access: token lookup: %w", err)
	}
	var rec AgentToken
	if json.Unmarshal(last.Data, &rec) != nil || rec.AgentID == "" {
		return nil, ErrUnknownToken // a revoke's deletion marker
	}
	return &rec, nil
}

// Revoke revokes every token of agentID and says how many there were.
func (t *Tokens) Revoke(ctx context.Context, agentID string) (*RevokedTokens, error) {
	if err := subjects.ValidateID("agent_id", agentID); err != nil {
		return nil, err
	}
	keys, err := t.kv.ListKeysFiltered(ctx, agtFilter(agentID))
	if err != nil {
		return nil, fmt.Errorf("access: revoke tokens: %w", err)
	}
	out := &RevokedTokens{AgentID: agentID}
	for key := range keys.Keys() {
		hash, _, err := kvrec.Get[string](ctx, t.kv, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("access: revoke tokens: %w", err)
		}
		// The token first, then the entry: a failure between leaves an
		// entry whose token is already gone, which the next revoke clears.
		purge := kvrec.Retention{Markers: t.markers}.Purge
		if err := purge(ctx, t.kv, tokKey(*hash)); err != nil {
			return nil, fmt.Errorf("access: revoke tokens: %w", err)
		}
		if err := purge(ctx, t.kv, key); err != nil {
			return nil, fmt.Errorf("access: revoke tokens: %w", err)
		}
		out.Revoked++
	}
	// Even with no token left: a connection may outlive a revoke that
	// failed half-way.
	if t.onRevoke != nil {
		t.onRevoke(ctx, agentID)
	}
	return out, nil
}
