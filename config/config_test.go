package config

import (
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

func valid() *Config {
	return &Config{DataDir: "d", NATSListen: "127.0.0.1:4222", JSReplicas: 1, HTTPAddr: "127.0.0.1:8080",
		Shards: 32, LeaseTTL: 2e9, LogLevel: "info", LogFormat: "text", InboxMaxAge: 168 * time.Hour, DedupWindow: 10 * time.Minute, NATSSessionMaxAge: time.Hour}
}

func TestHTTPListenerNeedsTokensBeyondLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr, tokens, err string
	}{
		{"127.0.0.1:8080", "", ""},
		{"[::1]:8080", "", ""},
		{"localhost:8080", "", ""},
		{"0.0.0.0:8080", "", "CHIME_HTTP_ADDR \"0.0.0.0:8080\" is not a loopback address and CHIME_OPERATOR_TOKENS_FILE is unset"},
		{":8080", "", "is not a loopback address"},
		{"10.1.2.3:8080", "", "is not a loopback address"},
		{"0.0.0.0:8080", "/etc/chime/operators", ""},
	} {
		c := valid()
		c.HTTPAddr, c.OperatorTokensFile = tc.addr, tc.tokens
		err := c.Validate()
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s tokens=%q: %v, want %q", tc.addr, tc.tokens, err, tc.err)
		}
	}
}

func TestPublicURL(t *testing.T) {
	for _, tc := range []struct {
		url string
		ok  bool
	}{{"https://chime.example.com", true}, {"http://10.0.0.1:8080/base", true}, {"ftp://x", false}, {"chime.example.com", false}, {"https://", false}} {
		c := valid()
		c.PublicURL = tc.url
		if err := c.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.url, err)
		}
	}
	c := valid()
	if got := c.CallbackBaseURL("127.0.0.1:9999"); got != "http://127.0.0.1:9999" {
		t.Errorf("default base %q", got)
	}
}

func TestDedupWindowBounds(t *testing.T) {
	for _, tc := range []struct {
		window time.Duration
		ok     bool
	}{{time.Second, true}, {10 * time.Minute, true}, {500 * time.Millisecond, false}, {169 * time.Hour, false}} {
		c := valid()
		c.DedupWindow = tc.window
		err := c.Validate()
		if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), "CHIME_DEDUP_WINDOW")) {
			t.Errorf("window %v: %v", tc.window, err)
		}
	}
}

func TestNATSAuthRequiredBeyondLoopback(t *testing.T) {
	for _, tc := range []struct {
		listen, url, key, responder, system string
		auth                                bool
		err                                 string
	}{
		{listen: "127.0.0.1:4222"},
		{listen: "0.0.0.0:4222", err: `CHIME_NATS_LISTEN "0.0.0.0:4222" is not a loopback address and CHIME_NATS_AUTH is not true`},
		{listen: ":4222", err: "is not a loopback address"},
		{listen: "0.0.0.0:4222", auth: true},
		{url: "nats://nats:4222", auth: true, err: "needs CHIME_NATS_CALLOUT_KEY_FILE"},
		{url: "nats://nats:4222", auth: true, key: "/keys/chime-callout.nk", err: "needs CHIME_NATS_RESPONDER_NKEY_FILE"},
		{url: "nats://nats:4222", auth: true, key: "/keys/chime-callout.nk", responder: "/keys/chime-responder.nk", err: "needs CHIME_NATS_SYSTEM_NKEY_FILE"},
		{url: "nats://nats:4222", auth: true, key: "/keys/chime-callout.nk", responder: "/keys/chime-responder.nk", system: "/keys/chime-system.nk"},
		{url: "nats://nats:4222"},
	} {
		c := valid()
		if tc.listen != "" {
			c.NATSListen = tc.listen
		}
		c.NATSURL, c.NATSAuth, c.NATSCalloutKeyFile, c.NATSResponderNkeyFile, c.NATSSystemNkeyFile = tc.url, tc.auth, tc.key, tc.responder, tc.system
		err := c.Validate()
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%+v: %v, want %q", tc, err, tc.err)
		}
	}
}

// TestLimitDefaults: the environment's defaults are the documented ones.
func TestLimitDefaults(t *testing.T) {
	for _, v := range []string{"MAX_TIMERS_PER_AGENT", "MAX_WAITS_PER_AGENT", "MAX_OPEN_QUESTIONS_PER_AGENT", "MIN_INTERVAL", "CREATE_RATE", "CREATE_BURST",
		"INBOX_MAX_BYTES", "INBOX_MAX_PER_AGENT", "EVENT_MAX_BYTES", "HISTORY_MAX_BYTES", "NOTIFICATIONS_MAX", "TASKS_MAX_BYTES", "TASK_OUTPUTS_MAX_BYTES"} {
		t.Setenv("CHIME_"+v, "") // unset counts as default only when absent
		os.Unsetenv("CHIME_" + v)
	}
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxTimersPerAgent != 10000 || c.MaxWaitsPerAgent != 1000 || c.MaxOpenQuestions != 100 || c.MinInterval != time.Second || c.CreateRate != 50 ||
		c.CreateBurst != 100 || c.InboxMaxBytes != 1<<30 || c.InboxMaxPerAgent != 10000 || c.EventMaxBytes != 256<<20 ||
		c.HistoryMaxBytes != 1<<30 || c.NotificationsMax != 100 {
		t.Fatalf("defaults: %+v", c)
	}
	// The buckets' byte limits: 1.67 GiB in all, with the streams' 3.92 GiB;
	// timers and waits, bounded per agent by count, take what is left.
	buckets := []ByteSize{c.TimersMaxBytes, c.WaitsMaxBytes, c.TasksMaxBytes, c.TaskOutputsMaxBytes, c.NotificationsMaxBytes,
		c.QuestionsMaxBytes, c.WaitForMaxBytes, c.IdempotencyMaxBytes, c.TokensMaxBytes, c.TriggersMaxBytes, c.AgentsMaxBytes}
	var sum ByteSize
	for _, b := range buckets {
		sum += b
	}
	if c.TasksMaxBytes != 256<<20 || c.TaskOutputsMaxBytes != 1<<30 || sum != 1712<<20 || c.TimersMaxBytes != 0 || c.WaitsMaxBytes != 0 {
		t.Fatalf("bucket limits %v, in all %v", buckets, sum)
	}
	t.Setenv("CHIME_TASK_OUTPUTS_MAX_BYTES", "64MiB")
	if c, err = Load(); err != nil || c.TaskOutputsMaxBytes != 64<<20 {
		t.Fatalf("CHIME_TASK_OUTPUTS_MAX_BYTES=64MiB: %v %+v", err, c)
	}
	os.Unsetenv("CHIME_TASK_OUTPUTS_MAX_BYTES")
	t.Setenv("CHIME_INBOX_MAX_BYTES", "512MiB")
	t.Setenv("CHIME_EVENT_MAX_BYTES", "16777216")
	if c, err = Load(); err != nil || c.InboxMaxBytes != 512<<20 || c.EventMaxBytes != 16<<20 {
		t.Fatalf("sizes: %v %+v", err, c)
	}
	t.Setenv("CHIME_NOTIFICATIONS_MAX", "0")
	if _, err := Load(); err == nil || err.Error() != "config: CHIME_NOTIFICATIONS_MAX must be from 1 to 10000, not 0" {
		t.Fatalf("NOTIFICATIONS_MAX=0: %v", err)
	}
	t.Setenv("CHIME_NOTIFICATIONS_MAX", "many")
	if _, err := Load(); err == nil || !strings.Contains(err.Error(), "NOTIFICATIONS_MAX") {
		t.Fatalf("NOTIFICATIONS_MAX=many: %v", err)
	}
	t.Setenv("CHIME_NOTIFICATIONS_MAX", "7")
	if c, err = Load(); err != nil || c.NotificationsMax != 7 {
		t.Fatalf("NOTIFICATIONS_MAX=7: %v %+v", err, c)
	}
	os.Unsetenv("CHIME_NOTIFICATIONS_MAX")
	t.Setenv("CHIME_INBOX_MAX_BYTES", "1GB")
	if _, err := Load(); err == nil || !strings.Contains(err.Error(), "INBOX_MAX_BYTES") {
		t.Fatalf("1GB: %v", err)
	}
}

// TestLimitValidation: each limit's error names its variable; zero turns
// a limit off.
func TestLimitValidation(t *testing.T) {
	for _, tc := range []struct {
		set  func(*Config)
		want string // "" valid
	}{
		{func(c *Config) {}, ""},
		{func(c *Config) { c.MaxTimersPerAgent = -1 }, "CHIME_MAX_TIMERS_PER_AGENT"},
		{func(c *Config) { c.MaxWaitsPerAgent = -1 }, "CHIME_MAX_WAITS_PER_AGENT"},
		{func(c *Config) { c.MaxOpenQuestions = -1 }, "CHIME_MAX_OPEN_QUESTIONS_PER_AGENT"},
		{func(c *Config) { c.MinInterval = 1500 * time.Microsecond }, "CHIME_MIN_INTERVAL"},
		{func(c *Config) { c.MinInterval = -time.Second }, "CHIME_MIN_INTERVAL"},
		{func(c *Config) { c.MinInterval = 25 * time.Hour }, "CHIME_MIN_INTERVAL"},
		{func(c *Config) { c.MinInterval = 250 * time.Millisecond }, ""},
		{func(c *Config) { c.CreateRate = -1 }, "CHIME_CREATE_RATE"},
		{func(c *Config) { c.CreateRate = 5 }, "CHIME_CREATE_BURST"},
		{func(c *Config) { c.CreateRate, c.CreateBurst = 0.5, 1 }, ""},
		{func(c *Config) { c.MaxRunningTasks = -1 }, "CHIME_MAX_RUNNING_TASKS_PER_AGENT must be 0 (no limit) or positive, not -1"},
		{func(c *Config) { c.MaxWaitFors = -2 }, "CHIME_MAX_WAITFORS_PER_AGENT must be 0 (no limit) or positive, not -2"},
		{func(c *Config) { c.MaxStreams = -1 }, "CHIME_MAX_STREAMS_PER_PRINCIPAL"},
		{func(c *Config) { c.TaskStartRate = -0.5 }, "CHIME_TASK_START_RATE must be 0 (no limit) or a positive number per second, not -0.5"},
		{func(c *Config) { c.NotifyRate = math.Inf(1) }, "CHIME_NOTIFY_RATE"},
		{func(c *Config) { c.TaskStartRate, c.NotifyRate, c.MaxTaskOutputBytes = 0.1, 1000, 1 }, ""},
		{func(c *Config) { c.InboxMaxBytes = 1 << 20 }, "CHIME_INBOX_MAX_BYTES must be 0 (no limit) or at least 8MiB, not 1MiB"},
		{func(c *Config) { c.EventMaxBytes = -1 }, "CHIME_EVENT_MAX_BYTES"},
		{func(c *Config) { c.HistoryMaxBytes = 1 << 10 }, "CHIME_HISTORY_MAX_BYTES must be 0 (no limit) or at least 8MiB, not 1KiB"},
		{func(c *Config) { c.InboxMaxBytes, c.EventMaxBytes = 8<<20, 1<<40 }, ""},
		{func(c *Config) { c.InboxMaxPerAgent = -1 }, "CHIME_INBOX_MAX_PER_AGENT"},
		{func(c *Config) { c.TasksMaxBytes = 4 << 20 }, "CHIME_TASKS_MAX_BYTES must be 0 (no limit) or at least 8MiB, not 4MiB"},
		{func(c *Config) { c.AgentsMaxBytes = -1 }, "CHIME_AGENTS_MAX_BYTES"},
		{func(c *Config) { c.IdempotencyMaxBytes = 1 }, "CHIME_IDEMPOTENCY_MAX_BYTES"},
		{func(c *Config) { c.TaskOutputsMaxBytes, c.TimersMaxBytes = 0, 8<<20 }, ""},
		{func(c *Config) { c.NotificationsMax = -1 }, "CHIME_NOTIFICATIONS_MAX must be from 1 to 10000, not -1"},
		{func(c *Config) { c.NotificationsMax = 10001 }, "CHIME_NOTIFICATIONS_MAX"},
		{func(c *Config) { c.NotificationsMax = 0 }, ""}, // in code: the default
		{func(c *Config) { c.NotificationsMax = 10000 }, ""},
	} {
		c := valid()
		tc.set(c)
		err := c.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want %q", c, err, tc.want)
		}
	}
}

func TestRecordRetention(t *testing.T) {
	for _, tc := range []struct {
		retention time.Duration
		ok        bool
	}{{0, true}, {time.Second, true}, {168 * time.Hour, true}, {1500 * time.Millisecond, false}, {500 * time.Millisecond, false}, {-time.Second, false}} {
		c := valid()
		c.RecordRetention = tc.retention
		err := c.Validate()
		if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), "CHIME_RECORD_RETENTION must be 0 (keep forever) or a whole number of seconds, not "+tc.retention.String())) {
			t.Errorf("retention %v: %v", tc.retention, err)
		}
	}
	t.Setenv("CHIME_HTTP_ADDR", "127.0.0.1:8080")
	c, err := Load()
	if err != nil || c.RecordRetention != 7*24*time.Hour {
		t.Fatalf("default retention %v (%v)", c.RecordRetention, err)
	}
}

func TestPprofOnlyOnLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{{"", true}, {"127.0.0.1:6060", true}, {"localhost:6060", true}, {"[::1]:6060", true}, {":6060", false}, {"0.0.0.0:6060", false}, {"10.0.0.1:6060", false}, {"6060", false}} {
		c := valid()
		c.PprofAddr = tc.addr
		err := c.Validate()
		if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), "CHIME_PPROF_ADDR")) {
			t.Errorf("%q: %v, want ok=%v", tc.addr, err, tc.ok)
		}
	}
}

func TestSessionMaxAge(t *testing.T) {
	for _, tc := range []struct {
		age time.Duration
		ok  bool
	}{{0, true}, {time.Minute, true}, {time.Hour, true}, {30 * time.Second, false}} {
		c := valid()
		c.NATSSessionMaxAge = tc.age
		err := c.Validate()
		if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), "CHIME_NATS_SESSION_MAX_AGE")) {
			t.Errorf("%v: %v", tc.age, err)
		}
	}
}
