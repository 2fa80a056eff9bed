// Package config owns chime's configuration: one struct filled from CHIME_*
// environment variables by envconfig, with defaults and validation that
// names the variable at fault.
package config

import (
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kelseyhightower/envconfig"
)

// Prefix of every variable.
const Prefix = "CHIME"

// Config is chime's whole configuration.
type Config struct {
	DataDir      string `envconfig:"DATA_DIR" default:"./data" desc:"JetStream store of the embedded server"`
	NATSListen   string `envconfig:"NATS_LISTEN" default:"127.0.0.1:4222" desc:"client address of the embedded server"`
	NATSURL      string `envconfig:"NATS_URL" desc:"external NATS server or cluster; set, no server is embedded"`
	NATSCreds    string `envconfig:"NATS_CREDS" desc:"credentials file for NATS_URL"`
	NATSToken    string `envconfig:"NATS_TOKEN" desc:"token for NATS_URL"`
	NATSNkeyFile string `envconfig:"NATS_NKEY_FILE" desc:"nkey seed file of chime's user for NATS_URL (see chime nats-config)"`
	// NATSAuth makes NATS enforce who may do what (package access).
	NATSAuth           bool   `envconfig:"NATS_AUTH" default:"false" desc:"authorize every NATS connection by its token through chime's auth callout; required when the embedded server listens beyond loopback"`
	NATSCalloutKeyFile string `envconfig:"NATS_CALLOUT_KEY_FILE" desc:"account nkey seed file that signs admitted users (NATS_AUTH with NATS_URL; see chime nats-config)"`
	// NATSResponderNkeyFile is the user that answers requests and may
	// publish only into inboxes (access.ResponderPublish).
	NATSResponderNkeyFile string `envconfig:"NATS_RESPONDER_NKEY_FILE" desc:"nkey seed file of chime's responder, the user that answers requests and may publish only replies into inboxes (NATS_AUTH with NATS_URL; see chime nats-config)"`
	// NATSSystemNkeyFile is a system account user: revoking a token ends
	// its open connections through the servers' kick service.
	NATSSystemNkeyFile string `envconfig:"NATS_SYSTEM_NKEY_FILE" desc:"nkey seed file of chime's system account user, through which a revoked token's open connections are ended (NATS_AUTH with NATS_URL; see chime nats-config)"`
	// NATSSessionMaxAge bounds an admitted connection: it must connect,
	// and be decided, again after it.
	NATSSessionMaxAge time.Duration `envconfig:"NATS_SESSION_MAX_AGE" default:"1h" desc:"how long an admitted NATS connection of an agent or callback sender lasts before it must authorize again (NATS_AUTH)"`
	JSReplicas        int           `envconfig:"JS_REPLICAS" default:"1" desc:"replicas of chime's streams and buckets"`
	HTTPAddr          string        `envconfig:"HTTP_ADDR" default:"127.0.0.1:8080" desc:"HTTP gateway, /metrics, /healthz, /readyz"`
	ReplicaID         string        `envconfig:"REPLICA_ID" desc:"name of this replica (default: host-pid)"`
	Shards            int           `envconfig:"SHARDS" default:"32" desc:"timer shards; every replica must agree"`
	Partitions        int           `envconfig:"PARTITIONS" default:"0" desc:"timer and wait buckets per kind, keys carrying their shard, each replica watching only its shards (0: one bucket watched whole by every replica); fixed when the store first holds records"`
	LeaseTTL          time.Duration `envconfig:"LEASE_TTL" default:"2s" desc:"shard lease TTL: a dead replica's timers move after about this"`
	InboxMaxAge       time.Duration `envconfig:"INBOX_MAX_AGE" default:"168h" desc:"how long inbox deliveries are kept"`
	EventMaxAge       time.Duration `envconfig:"EVENT_MAX_AGE" default:"24h" desc:"how long internal events are kept"`
	DedupWindow       time.Duration `envconfig:"DEDUP_WINDOW" default:"10m" desc:"how long the streams remember message IDs; older repeats are looked up in the inbox"`
	TimeZone          string        `envconfig:"TIMEZONE" desc:"IANA zone naive wait times are read in when a request has no tz (default UTC)"`
	PublicURL         string        `envconfig:"PUBLIC_URL" desc:"base URL of callback trigger URLs (default: http://HTTP_ADDR, https:// with HTTP_TLS_CERT)"`
	// OperatorTokensFile holds hex SHA-256 hashes of operator bearer tokens.
	OperatorTokensFile string `envconfig:"OPERATOR_TOKENS_FILE" desc:"file of hex SHA-256 hashes of operator bearer tokens; unset: control routes open, loopback only"`
	LogLevel           string `envconfig:"LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
	LogFormat          string `envconfig:"LOG_FORMAT" default:"text" desc:"text or json"`
	// PprofAddr serves Go's profiles, which show internals (stacks, and
	// with them record keys), so only on loopback: kubectl port-forward
	// reaches it.
	PprofAddr string `envconfig:"PPROF_ADDR" desc:"loopback address serving Go's /debug/pprof profiles; unset: none"`
	// HTTPAccessLog logs each HTTP request at info.
	HTTPAccessLog bool `envconfig:"HTTP_ACCESS_LOG" default:"false" desc:"log each HTTP request at info (method, path without a callback's token, status, bytes, duration)"`

	// TLS (config/tls.go): PEM files, read at start, so a renewed
	// certificate takes a restart.
	NATSTLSCert       string `envconfig:"NATS_TLS_CERT" desc:"certificate of the embedded server's client listener, which then serves TLS only (with NATS_TLS_KEY)"`
	NATSTLSKey        string `envconfig:"NATS_TLS_KEY" desc:"private key of NATS_TLS_CERT"`
	NATSTLSCA         string `envconfig:"NATS_TLS_CA" desc:"CA certificates: with NATS_URL (and for the CLI) the CA that verifies the server; embedded, the CA every client's certificate must chain to (clients then need one)"`
	NATSTLSClientCert string `envconfig:"NATS_TLS_CLIENT_CERT" desc:"client certificate chime and the CLI present to NATS_URL (with NATS_TLS_CLIENT_KEY)"`
	NATSTLSClientKey  string `envconfig:"NATS_TLS_CLIENT_KEY" desc:"private key of NATS_TLS_CLIENT_CERT"`
	HTTPTLSCert       string `envconfig:"HTTP_TLS_CERT" desc:"certificate (chain) of the HTTP gateway, which then serves HTTPS only (with HTTP_TLS_KEY)"`
	HTTPTLSKey        string `envconfig:"HTTP_TLS_KEY" desc:"private key of HTTP_TLS_CERT"`

	// Quotas and limits. Zero turns each off (a Config built in code
	// without them has none); the defaults protect a 2-core node.
	MaxTimersPerAgent int           `envconfig:"MAX_TIMERS_PER_AGENT" default:"10000" desc:"active timers one agent may have; 0: no limit"`
	MaxWaitsPerAgent  int           `envconfig:"MAX_WAITS_PER_AGENT" default:"1000" desc:"waiting waits one agent may have; 0: no limit"`
	MaxOpenQuestions  int           `envconfig:"MAX_OPEN_QUESTIONS_PER_AGENT" default:"100" desc:"unanswered questions to the operator one agent may have; 0: no limit"`
	MinInterval       time.Duration `envconfig:"MIN_INTERVAL" default:"1s" desc:"shortest interval of a repeating timer; 0: any"`
	CreateRate        float64       `envconfig:"CREATE_RATE" default:"50" desc:"timer creates and wait requests per second per agent, on each replica; 0: no limit"`
	CreateBurst       int           `envconfig:"CREATE_BURST" default:"100" desc:"creates an agent may make at once before CREATE_RATE paces it"`
	// Per-agent bounds of tasks, WaitFor, notify and event streams
	// (package quotas): defaults an agent never meets in normal use.
	MaxRunningTasks    int      `envconfig:"MAX_RUNNING_TASKS_PER_AGENT" default:"1000" desc:"running tasks one agent may have; 0: no limit"`
	TaskStartRate      float64  `envconfig:"TASK_START_RATE" default:"50" desc:"tasks one agent may start per second, on each replica, in bursts of twice as many; 0: no limit"`
	MaxTaskOutputBytes ByteSize `envconfig:"MAX_TASK_OUTPUT_BYTES_PER_AGENT" default:"1GiB" desc:"task output one agent may keep stored (appended parts and outputs over 16 KiB, until their tasks expire); 0: no limit"`
	MaxWaitFors        int      `envconfig:"MAX_WAITFORS_PER_AGENT" default:"1000" desc:"live WaitFor registrations (one a scope) one agent may have; 0: no limit"`
	MaxMCPTasks        int      `envconfig:"MAX_MCP_TASKS_PER_AGENT" default:"1000" desc:"MCP tasks one agent may hold (going, or ended and not read yet); 0: no limit"`
	MaxMonitors        int      `envconfig:"MAX_MONITORS_PER_AGENT" default:"20" desc:"running monitors one agent may have; 0: no limit"`
	MonitorSubjects    string   `envconfig:"MONITOR_SUBJECTS" default:"" desc:"NATS subject patterns, comma-separated, agents' monitors may watch ({agent} stands for the agent's ID); empty: none"`
	MonitorKV          string   `envconfig:"MONITOR_KV" default:"" desc:"KV keys agents' monitors may watch, comma-separated <bucket>/<key pattern> ({agent} stands for the agent's ID); never chime's buckets; empty: none"`
	MonitorURLs        string   `envconfig:"MONITOR_URLS" default:"" desc:"URL prefixes (scheme://host[:port]/path), comma-separated, agents' monitors may open: ws:// and wss:// for WebSockets, http:// and https:// for polls ({agent} in the path stands for the agent's ID); empty: none"`
	NotifyRate         float64  `envconfig:"NOTIFY_RATE" default:"50" desc:"notifies one agent may send per second, on each replica, in bursts of twice as many; 0: no limit"`
	MaxStreams         int      `envconfig:"MAX_STREAMS_PER_PRINCIPAL" default:"32" desc:"event streams (SSE) one principal (an agent, an operator token, loopback without a token) may hold open on each replica; 0: no limit"`
	InboxMaxBytes      ByteSize `envconfig:"INBOX_MAX_BYTES" default:"1GiB" desc:"size of the inbox stream; the oldest deliveries go beyond it; 0: no limit"`
	InboxMaxPerAgent   int64    `envconfig:"INBOX_MAX_PER_AGENT" default:"10000" desc:"deliveries kept per agent inbox; its oldest go beyond it; 0: no limit"`
	EventMaxBytes      ByteSize `envconfig:"EVENT_MAX_BYTES" default:"256MiB" desc:"size of the internal events stream; the oldest events go beyond it; 0: no limit"`
	HistoryMaxBytes    ByteSize `envconfig:"HISTORY_MAX_BYTES" default:"1GiB" desc:"size of the history stream (CHIME_HISTORY: finished timers and ended waits kept for RECORD_RETENTION after they left their bucket); the oldest go beyond it, before their retention ends; 0: no limit"`
	// Byte limits of the buckets and the store chime writes on agents'
	// behalf, so that agent data never takes the room timers, leases and
	// inboxes need. Each is reserved in the JetStream store; full, a
	// bucket refuses what would grow it (bucket_full) and keeps every
	// record. Defaults: far above one agent's normal use, 1.67 GiB in all; timers and
	// waits none (bounded per agent by count).
	TimersMaxBytes        ByteSize `envconfig:"TIMERS_MAX_BYTES" default:"0" desc:"size of the timers bucket (chime_timers); full, timer creates are refused, and fires whose record grows wait; 0: no limit (the default: timers are bounded per agent by MAX_TIMERS_PER_AGENT, and their room is what the other limits leave)"`
	WaitsMaxBytes         ByteSize `envconfig:"WAITS_MAX_BYTES" default:"0" desc:"size of the waits bucket (chime_waits); full, wait requests are refused; 0: no limit (the default, as TIMERS_MAX_BYTES)"`
	TasksMaxBytes         ByteSize `envconfig:"TASKS_MAX_BYTES" default:"256MiB" desc:"size of the task records bucket (chime_tasks), outputs up to 16 KiB included; 0: no limit"`
	TaskOutputsMaxBytes   ByteSize `envconfig:"TASK_OUTPUTS_MAX_BYTES" default:"1GiB" desc:"size of the task outputs object store (chime_task_outputs, outputs over 16 KiB); 0: no limit"`
	NotificationsMaxBytes ByteSize `envconfig:"NOTIFICATIONS_MAX_BYTES" default:"128MiB" desc:"size of the notifications bucket (chime_notifications); 0: no limit"`
	QuestionsMaxBytes     ByteSize `envconfig:"QUESTIONS_MAX_BYTES" default:"32MiB" desc:"size of the questions bucket (chime_questions); 0: no limit"`
	MCPTasksMaxBytes      ByteSize `envconfig:"MCP_TASKS_MAX_BYTES" default:"32MiB" desc:"size of the MCP task handles bucket (chime_mcp_tasks); 0: no limit"`
	MonitorsMaxBytes      ByteSize `envconfig:"MONITORS_MAX_BYTES" default:"32MiB" desc:"size of the monitors bucket (chime_monitors); 0: no limit"`
	WaitForMaxBytes       ByteSize `envconfig:"WAITFOR_MAX_BYTES" default:"64MiB" desc:"size of the WaitFor registrations bucket (chime_waitfor); 0: no limit"`
	IdempotencyMaxBytes   ByteSize `envconfig:"IDEMPOTENCY_MAX_BYTES" default:"128MiB" desc:"size of the callback Idempotency-Key bucket (chime_idempotency, keys kept a day); 0: no limit"`
	TokensMaxBytes        ByteSize `envconfig:"TOKENS_MAX_BYTES" default:"16MiB" desc:"size of the agent tokens bucket (chime_tokens); 0: no limit"`
	TriggersMaxBytes      ByteSize `envconfig:"TRIGGERS_MAX_BYTES" default:"32MiB" desc:"size of the external triggers bucket (chime_triggers); 0: no limit"`
	AgentsMaxBytes        ByteSize `envconfig:"AGENTS_MAX_BYTES" default:"32MiB" desc:"size of the per-agent state bucket (chime_agents); 0: no limit"`
	// NotificationsMax is how many notifications each agent keeps (Agent
	// Zero's max_notifications); 0 in a Config built in code is the default.
	NotificationsMax int `envconfig:"NOTIFICATIONS_MAX" default:"100" desc:"notifications kept per agent; the oldest go beyond it (1 to 10000)"`
	// RecordRetention is how long finished timers, ended waits and revoked
	// triggers stay (and so how long a request_id is remembered); 0 keeps
	// them forever.
	RecordRetention time.Duration `envconfig:"RECORD_RETENTION" default:"168h" desc:"how long finished timers, ended waits and revoked triggers are kept (whole seconds; 0: forever)"`
}

// MaxNotificationsMax bounds CHIME_NOTIFICATIONS_MAX: every replica holds
// every agent's notifications in memory, and a history is one reply.
const MaxNotificationsMax = 10000

func notificationsMaxError(n int) error {
	return fmt.Errorf("config: CHIME_NOTIFICATIONS_MAX must be from 1 to %d, not %d", MaxNotificationsMax, n)
}

// ByteSize is a size in bytes, written as a plain number or with a binary
// suffix: 1073741824, 1GiB, 512MiB, 64KiB.
type ByteSize int64

var byteUnits = []struct {
	suffix string
	n      int64
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

// Decode parses a size for envconfig.
func (b *ByteSize) Decode(v string) error {
	v = strings.TrimSpace(v)
	unit := int64(1)
	for _, u := range byteUnits {
		if num, ok := strings.CutSuffix(v, u.suffix); ok {
			v, unit = strings.TrimSpace(num), u.n
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/unit {
		return fmt.Errorf("%q is not a size: a whole number of bytes, or with KiB, MiB, GiB or TiB", v)
	}
	*b = ByteSize(n * unit)
	return nil
}

// String writes the size in the largest unit that divides it.
func (b ByteSize) String() string {
	for _, u := range byteUnits {
		if b != 0 && int64(b)%u.n == 0 {
			return strconv.FormatInt(int64(b)/u.n, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(b), 10)
}

// minStreamBytes is the smallest stream size limit accepted: below it one
// large delivery (the server's max payload, 1 MiB by default) could not be
// stored at all.
const minStreamBytes = 8 << 20

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
	if c.NotificationsMax == 0 { // set so: in code, 0 means the default
		return nil, notificationsMaxError(0)
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
		if host, _, _ := net.SplitHostPort(c.NATSListen); !Loopback(host) && !c.NATSAuth {
			return fmt.Errorf("config: CHIME_NATS_LISTEN %q is not a loopback address and CHIME_NATS_AUTH is not true: any client on the network could read every inbox and act as any agent", c.NATSListen)
		}
	} else if c.NATSAuth && c.NATSCalloutKeyFile == "" {
		return fmt.Errorf("config: CHIME_NATS_AUTH with CHIME_NATS_URL needs CHIME_NATS_CALLOUT_KEY_FILE, the seed whose public key is the servers' auth_callout issuer (see chime nats-config)")
	} else if c.NATSAuth && c.NATSResponderNkeyFile == "" {
		return fmt.Errorf("config: CHIME_NATS_AUTH with CHIME_NATS_URL needs CHIME_NATS_RESPONDER_NKEY_FILE, the seed of the user that answers requests and may publish only into inboxes (see chime nats-config)")
	} else if c.NATSAuth && c.NATSSystemNkeyFile == "" {
		return fmt.Errorf("config: CHIME_NATS_AUTH with CHIME_NATS_URL needs CHIME_NATS_SYSTEM_NKEY_FILE, the seed of chime's system account user, which ends a revoked token's connections (see chime nats-config)")
	}
	if c.NATSSessionMaxAge != 0 && c.NATSSessionMaxAge < time.Minute {
		return fmt.Errorf("config: CHIME_NATS_SESSION_MAX_AGE must be at least 1m, not %v", c.NATSSessionMaxAge)
	}
	if c.JSReplicas < 1 || c.JSReplicas > 5 {
		return fmt.Errorf("config: CHIME_JS_REPLICAS must be 1-5, not %d", c.JSReplicas)
	}
	if c.Shards < 1 || c.Shards > 4096 {
		return fmt.Errorf("config: CHIME_SHARDS must be 1-4096, not %d", c.Shards)
	}
	if c.Partitions < 0 || c.Partitions > c.Shards {
		return fmt.Errorf("config: CHIME_PARTITIONS must be 0-CHIME_SHARDS (%d), not %d: a partition holds whole shards", c.Shards, c.Partitions)
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
		if c.OperatorTokensFile == "" && !Loopback(host) {
			return fmt.Errorf("config: CHIME_HTTP_ADDR %q is not a loopback address and CHIME_OPERATOR_TOKENS_FILE is unset: the control routes would be open to the network; give operator tokens (a file of their SHA-256 hashes, one per line) or set CHIME_HTTP_ADDR=127.0.0.1:8080", c.HTTPAddr)
		}
	}
	if c.PprofAddr != "" {
		if host, _, err := net.SplitHostPort(c.PprofAddr); err != nil || !Loopback(host) {
			return fmt.Errorf("config: CHIME_PPROF_ADDR %q must be a loopback host:port (127.0.0.1:6060): profiles show chime's internals", c.PprofAddr)
		}
	}
	if c.PublicURL != "" {
		if u, err := url.Parse(c.PublicURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("config: CHIME_PUBLIC_URL %q must be an http or https URL", c.PublicURL)
		}
	}
	if err := c.validateTLS(); err != nil {
		return err
	}
	if err := c.validateLimits(); err != nil {
		return err
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

// validateLimits checks the quotas and stream limits.
func (c *Config) validateLimits() error {
	if c.MaxTimersPerAgent < 0 {
		return fmt.Errorf("config: CHIME_MAX_TIMERS_PER_AGENT must be 0 (no limit) or positive, not %d", c.MaxTimersPerAgent)
	}
	if c.NotificationsMax < 0 || c.NotificationsMax > MaxNotificationsMax {
		return notificationsMaxError(c.NotificationsMax)
	}
	if c.MaxWaitsPerAgent < 0 {
		return fmt.Errorf("config: CHIME_MAX_WAITS_PER_AGENT must be 0 (no limit) or positive, not %d", c.MaxWaitsPerAgent)
	}
	if c.MaxMonitors < 0 {
		return fmt.Errorf("config: CHIME_MAX_MONITORS_PER_AGENT must be 0 (no limit) or positive, not %d", c.MaxMonitors)
	}
	if c.MaxMCPTasks < 0 {
		return fmt.Errorf("config: CHIME_MAX_MCP_TASKS_PER_AGENT must be 0 (no limit) or positive, not %d", c.MaxMCPTasks)
	}
	if c.MaxOpenQuestions < 0 {
		return fmt.Errorf("config: CHIME_MAX_OPEN_QUESTIONS_PER_AGENT must be 0 (no limit) or positive, not %d", c.MaxOpenQuestions)
	}
	// Whole milliseconds: the refusal names the minimum in interval_ms.
	if c.MinInterval < 0 || c.MinInterval%time.Millisecond != 0 || c.MinInterval > 24*time.Hour {
		return fmt.Errorf("config: CHIME_MIN_INTERVAL must be whole milliseconds from 0 to 24h, not %v", c.MinInterval)
	}
	if c.CreateRate < 0 || math.IsNaN(c.CreateRate) || math.IsInf(c.CreateRate, 0) {
		return fmt.Errorf("config: CHIME_CREATE_RATE must be 0 (no limit) or a positive number per second, not %v", c.CreateRate)
	}
	if c.CreateRate > 0 && c.CreateBurst < 1 {
		return fmt.Errorf("config: CHIME_CREATE_BURST must be at least 1 when CHIME_CREATE_RATE is set, not %d", c.CreateBurst)
	}
	for _, l := range []struct {
		name string
		v    ByteSize
	}{
		{"CHIME_INBOX_MAX_BYTES", c.InboxMaxBytes}, {"CHIME_EVENT_MAX_BYTES", c.EventMaxBytes},
		{"CHIME_HISTORY_MAX_BYTES", c.HistoryMaxBytes},
		{"CHIME_TIMERS_MAX_BYTES", c.TimersMaxBytes}, {"CHIME_WAITS_MAX_BYTES", c.WaitsMaxBytes},
		{"CHIME_TASKS_MAX_BYTES", c.TasksMaxBytes}, {"CHIME_TASK_OUTPUTS_MAX_BYTES", c.TaskOutputsMaxBytes},
		{"CHIME_NOTIFICATIONS_MAX_BYTES", c.NotificationsMaxBytes}, {"CHIME_QUESTIONS_MAX_BYTES", c.QuestionsMaxBytes}, {"CHIME_MCP_TASKS_MAX_BYTES", c.MCPTasksMaxBytes}, {"CHIME_MONITORS_MAX_BYTES", c.MonitorsMaxBytes},
		{"CHIME_WAITFOR_MAX_BYTES", c.WaitForMaxBytes}, {"CHIME_IDEMPOTENCY_MAX_BYTES", c.IdempotencyMaxBytes},
		{"CHIME_TOKENS_MAX_BYTES", c.TokensMaxBytes}, {"CHIME_TRIGGERS_MAX_BYTES", c.TriggersMaxBytes},
		{"CHIME_AGENTS_MAX_BYTES", c.AgentsMaxBytes},
	} {
		if l.v != 0 && l.v < minStreamBytes {
			return fmt.Errorf("config: %s must be 0 (no limit) or at least %v, not %v", l.name, ByteSize(minStreamBytes), l.v)
		}
	}
	for _, l := range []struct {
		name string
		v    int
	}{{"CHIME_MAX_RUNNING_TASKS_PER_AGENT", c.MaxRunningTasks}, {"CHIME_MAX_WAITFORS_PER_AGENT", c.MaxWaitFors}, {"CHIME_MAX_STREAMS_PER_PRINCIPAL", c.MaxStreams}} {
		if l.v < 0 {
			return fmt.Errorf("config: %s must be 0 (no limit) or positive, not %d", l.name, l.v)
		}
	}
	for _, r := range []struct {
		name string
		v    float64
	}{{"CHIME_TASK_START_RATE", c.TaskStartRate}, {"CHIME_NOTIFY_RATE", c.NotifyRate}} {
		if r.v < 0 || math.IsNaN(r.v) || math.IsInf(r.v, 0) {
			return fmt.Errorf("config: %s must be 0 (no limit) or a positive number per second, not %v", r.name, r.v)
		}
	}
	if c.InboxMaxPerAgent < 0 {
		return fmt.Errorf("config: CHIME_INBOX_MAX_PER_AGENT must be 0 (no limit) or positive, not %d", c.InboxMaxPerAgent)
	}
	return nil
}

// Loopback reports a host (a name or an IP, no port) that only this
// machine reaches.
func Loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// CallbackBaseURL is where trigger URLs point: CHIME_PUBLIC_URL, or the
// HTTP gateway's own address (https with CHIME_HTTP_TLS_CERT).
func (c *Config) CallbackBaseURL(boundAddr string) string {
	if c.PublicURL != "" {
		return c.PublicURL
	}
	if c.HTTPTLSCert != "" {
		return "https://" + boundAddr
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
