// Package config owns chime's configuration: one struct filled from CHIME_*
// environment variables by envconfig, with defaults and validation that
// names the variable at fault.
package config

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/kelseyhightower/envconfig"
)

// Prefix of every variable.
const Prefix = "CHIME"

// Config is chime's whole configuration.
type Config struct {
	DataDir     string        `envconfig:"DATA_DIR" default:"./data" desc:"JetStream store of the embedded server"`
	NATSListen  string        `envconfig:"NATS_LISTEN" default:"127.0.0.1:4222" desc:"client address of the embedded server"`
	NATSURL     string        `envconfig:"NATS_URL" desc:"external NATS server or cluster; set, no server is embedded"`
	NATSCreds   string        `envconfig:"NATS_CREDS" desc:"credentials file for NATS_URL"`
	NATSToken   string        `envconfig:"NATS_TOKEN" desc:"token for NATS_URL"`
	JSReplicas  int           `envconfig:"JS_REPLICAS" default:"1" desc:"replicas of chime's streams and buckets"`
	HTTPAddr    string        `envconfig:"HTTP_ADDR" default:"127.0.0.1:8080" desc:"HTTP gateway, /metrics, /healthz, /readyz"`
	ReplicaID   string        `envconfig:"REPLICA_ID" desc:"name of this replica (default: host-pid)"`
	Shards      int           `envconfig:"SHARDS" default:"32" desc:"timer shards; every replica must agree"`
	LeaseTTL    time.Duration `envconfig:"LEASE_TTL" default:"2s" desc:"shard lease TTL: a dead replica's timers move after about this"`
	InboxMaxAge time.Duration `envconfig:"INBOX_MAX_AGE" default:"168h" desc:"how long inbox deliveries are kept"`
	EventMaxAge time.Duration `envconfig:"EVENT_MAX_AGE" default:"24h" desc:"how long internal events are kept"`
	DedupWindow time.Duration `envconfig:"DEDUP_WINDOW" default:"10m" desc:"how long the streams remember message IDs; older repeats are looked up in the inbox"`
	TimeZone    string        `envconfig:"TIMEZONE" desc:"IANA zone naive wait times are read in when a request has no tz (default UTC)"`
	PublicURL   string        `envconfig:"PUBLIC_URL" desc:"base URL of callback trigger URLs (default: http://HTTP_ADDR)"`
	// OperatorTokensFile holds hex SHA-256 hashes of operator bearer tokens.
	OperatorTokensFile string `envconfig:"OPERATOR_TOKENS_FILE" desc:"file of hex SHA-256 hashes of operator bearer tokens; unset: control routes open, loopback only"`
	LogLevel           string `envconfig:"LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
	LogFormat          string `envconfig:"LOG_FORMAT" default:"text" desc:"text or json"`

	// RecordRetention is how long finished timers, ended waits and revoked
	// triggers stay (and so how long a request_id is remembered); 0 keeps
	// them forever.
	RecordRetention time.Duration `envconfig:"RECORD_RETENTION" default:"168h" desc:"how long finished timers, ended waits and revoked triggers are kept (whole seconds; 0: forever)"`
}

// Load reads the environment and validates the result.
func Load() (*Config, error) {
	var c Config
	if err := envconfig.Process(Prefix, &c); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if c.ReplicaID == "" {
		host, _ := os.Hostname()
		c.ReplicaID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	return &c, c.Validate()
}

// Validate checks every field and names the variable at fault.
func (c *Config) Validate() error {
	if c.TimeZone != "" {
		if _, err := time.LoadLocation(c.TimeZone); err != nil || c.TimeZone == "Local" {
			return fmt.Errorf("config: CHIME_TIMEZONE %q: not an IANA time zone", c.TimeZone)
		}
	}
	if c.NATSURL == "" {
		if _, p, err := net.SplitHostPort(c.NATSListen); err != nil {
			return fmt.Errorf("config: CHIME_NATS_LISTEN %q: %w", c.NATSListen, err)
		} else if _, err := strconv.Atoi(p); err != nil {
			return fmt.Errorf("config: CHIME_NATS_LISTEN %q: port must be a number", c.NATSListen)
		}
		if c.DataDir == "" {
			return fmt.Errorf("config: CHIME_DATA_DIR must not be empty")
		}
	}
	if c.JSReplicas < 1 || c.JSReplicas > 5 {
		return fmt.Errorf("config: CHIME_JS_REPLICAS must be 1-5, not %d", c.JSReplicas)
	}
	if c.Shards < 1 || c.Shards > 4096 {
		return fmt.Errorf("config: CHIME_SHARDS must be 1-4096, not %d", c.Shards)
	}
	if c.DedupWindow < time.Second || c.DedupWindow > c.InboxMaxAge {
		return fmt.Errorf("config: CHIME_DEDUP_WINDOW must be at least 1s and at most CHIME_INBOX_MAX_AGE, not %v", c.DedupWindow)
	}
	// Record TTLs are whole seconds (so at least one).
	if c.RecordRetention < 0 || c.RecordRetention%time.Second != 0 {
		return fmt.Errorf("config: CHIME_RECORD_RETENTION must be 0 (keep forever) or a whole number of seconds, not %s", c.RecordRetention)
	}
	if c.LeaseTTL < 500*time.Millisecond {
		return fmt.Errorf("config: CHIME_LEASE_TTL must be at least 500ms, not %s", c.LeaseTTL)
	}
	if c.HTTPAddr != "" {
		host, _, err := net.SplitHostPort(c.HTTPAddr)
		if err != nil {
			return fmt.Errorf("config: CHIME_HTTP_ADDR %q: %w", c.HTTPAddr, err)
		}
		if c.OperatorTokensFile == "" && !loopback(host) {
			return fmt.Errorf("config: CHIME_HTTP_ADDR %q is not a loopback address and CHIME_OPERATOR_TOKENS_FILE is unset: the control routes would be open to the network", c.HTTPAddr)
		}
	}
	if c.PublicURL != "" {
		if u, err := url.Parse(c.PublicURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("config: CHIME_PUBLIC_URL %q must be an http or https URL", c.PublicURL)
		}
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("config: CHIME_LOG_LEVEL must be debug, info, warn or error, not %q", c.LogLevel)
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		return fmt.Errorf("config: CHIME_LOG_FORMAT must be text or json, not %q", c.LogFormat)
	}
	return nil
}

// loopback reports a host that only this machine reaches.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// CallbackBaseURL is where trigger URLs point: CHIME_PUBLIC_URL, or the
// HTTP gateway's own address.
func (c *Config) CallbackBaseURL(boundAddr string) string {
	if c.PublicURL != "" {
		return c.PublicURL
	}
	return "http://" + boundAddr
}

// Usage writes the table of variables with their defaults.
func Usage(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	const format = "{{range .}}{{usage_key .}}\t{{usage_default .}}\t{{usage_description .}}\n{{end}}"
	fmt.Fprintln(tw, "VARIABLE\tDEFAULT\tDESCRIPTION")
	if err := envconfig.Usagef(Prefix, &Config{}, tw, format); err != nil {
		return err
	}
	return tw.Flush()
}
