package config

import (
	"strings"
	"testing"
	"time"
)

func valid() *Config {
	return &Config{DataDir: "d", NATSListen: "127.0.0.1:4222", JSReplicas: 1, HTTPAddr: "127.0.0.1:8080",
		Shards: 32, LeaseTTL: 2e9, LogLevel: "info", LogFormat: "text", InboxMaxAge: 168 * time.Hour, DedupWindow: 10 * time.Minute}
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
