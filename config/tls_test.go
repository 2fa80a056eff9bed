package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chime-nats/chime/internal/tlstest"
)

// TestTLSFiles: each TLS variable is checked at start, and an error names
// the variable at fault.
func TestTLSFiles(t *testing.T) {
	certs := tlstest.New(t)
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, tc := range []struct {
		name string
		set  func(c *Config)
		err  string
	}{
		{"embedded server certificate", func(c *Config) { c.NATSTLSCert, c.NATSTLSKey = certs.ServerCert, certs.ServerKey }, ""},
		{"embedded with client verification", func(c *Config) {
			c.NATSTLSCert, c.NATSTLSKey, c.NATSTLSCA = certs.ServerCert, certs.ServerKey, certs.CA
		}, ""},
		{"external with CA and client certificate", func(c *Config) {
			c.NATSURL, c.NATSTLSCA, c.NATSTLSClientCert, c.NATSTLSClientKey = "tls://nats:4222", certs.CA, certs.ClientCert, certs.ClientKey
		}, ""},
		{"HTTPS", func(c *Config) { c.HTTPTLSCert, c.HTTPTLSKey = certs.ServerCert, certs.ServerKey }, ""},
		{"certificate without key", func(c *Config) { c.NATSTLSCert = certs.ServerCert }, "CHIME_NATS_TLS_CERT is set without CHIME_NATS_TLS_KEY"},
		{"key without certificate", func(c *Config) { c.NATSTLSKey = certs.ServerKey }, "CHIME_NATS_TLS_KEY is set without CHIME_NATS_TLS_CERT"},
		{"HTTP certificate without key", func(c *Config) { c.HTTPTLSCert = certs.ServerCert }, "CHIME_HTTP_TLS_CERT is set without CHIME_HTTP_TLS_KEY"},
		{"client key without certificate", func(c *Config) {
			c.NATSURL, c.NATSTLSClientKey = "tls://nats:4222", certs.ClientKey
		}, "CHIME_NATS_TLS_CLIENT_KEY is set without CHIME_NATS_TLS_CLIENT_CERT"},
		{"unreadable certificate", func(c *Config) { c.NATSTLSCert, c.NATSTLSKey = missing, certs.ServerKey }, "CHIME_NATS_TLS_CERT: open " + missing},
		{"unreadable key", func(c *Config) { c.HTTPTLSCert, c.HTTPTLSKey = certs.ServerCert, missing }, "CHIME_HTTP_TLS_KEY: open " + missing},
		{"another certificate's key", func(c *Config) { c.HTTPTLSCert, c.HTTPTLSKey = certs.ServerCert, certs.ClientKey },
			"CHIME_HTTP_TLS_CERT \"" + certs.ServerCert + "\" and CHIME_HTTP_TLS_KEY \"" + certs.ClientKey + "\" are not a PEM certificate and its private key"},
		{"certificate not PEM", func(c *Config) {
			c.NATSURL, c.NATSTLSClientCert, c.NATSTLSClientKey = "tls://nats:4222", notPEM, certs.ClientKey
		}, "CHIME_NATS_TLS_CLIENT_CERT \"" + notPEM + "\" and CHIME_NATS_TLS_CLIENT_KEY"},
		{"CA not PEM", func(c *Config) { c.NATSURL, c.NATSTLSCA = "tls://nats:4222", notPEM }, `CHIME_NATS_TLS_CA "` + notPEM + `" holds no PEM certificate`},
		{"CA unreadable", func(c *Config) { c.NATSURL, c.NATSTLSCA = "tls://nats:4222", missing }, "CHIME_NATS_TLS_CA: open " + missing},
		{"embedded server certificate with NATS_URL", func(c *Config) {
			c.NATSURL, c.NATSTLSCert, c.NATSTLSKey = "tls://nats:4222", certs.ServerCert, certs.ServerKey
		}, "CHIME_NATS_TLS_CERT and CHIME_NATS_TLS_KEY are the embedded server's, and CHIME_NATS_URL runs none"},
		{"embedded CA without a server certificate", func(c *Config) { c.NATSTLSCA = certs.CA }, "CHIME_NATS_TLS_CA (the CA client certificates must chain to) needs CHIME_NATS_TLS_CERT"},
		{"HTTPS without HTTP", func(c *Config) { c.HTTPAddr, c.HTTPTLSCert, c.HTTPTLSKey = "", certs.ServerCert, certs.ServerKey }, "CHIME_HTTP_ADDR is empty"},
	} {
		c := valid()
		tc.set(c)
		err := c.Validate()
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
		}
	}
}

func TestHTTPSCallbackBase(t *testing.T) {
	certs := tlstest.New(t)
	c := valid()
	c.HTTPTLSCert, c.HTTPTLSKey = certs.ServerCert, certs.ServerKey
	if got := c.CallbackBaseURL("127.0.0.1:8443"); got != "https://127.0.0.1:8443" {
		t.Errorf("base with TLS %q", got)
	}
	c.PublicURL = "https://chime.example.com"
	if got := c.CallbackBaseURL("127.0.0.1:8443"); got != c.PublicURL {
		t.Errorf("base with PUBLIC_URL %q", got)
	}
	tc, err := c.HTTPTLS()
	if err != nil || tc == nil || len(tc.Certificates) != 1 {
		t.Fatalf("HTTPTLS: %v, %v", tc, err)
	}
	if tc, err := valid().HTTPTLS(); tc != nil || err != nil {
		t.Errorf("HTTPTLS without a certificate: %v, %v", tc, err)
	}
}

// TestClearTextWarnings: tokens that would cross the network unencrypted
// are warned about; loopback and TLS listeners are not.
func TestClearTextWarnings(t *testing.T) {
	certs := tlstest.New(t)
	for _, tc := range []struct {
		name string
		set  func(c *Config)
		want []string
	}{
		{"loopback", func(*Config) {}, nil},
		{"embedded NATS beyond loopback with auth", func(c *Config) { c.NATSListen, c.NATSAuth = "0.0.0.0:4222", true },
			[]string{`CHIME_NATS_LISTEN "0.0.0.0:4222" is beyond loopback without TLS (CHIME_NATS_TLS_CERT): every client's token crosses the network in clear text`}},
		{"embedded NATS beyond loopback with TLS", func(c *Config) {
			c.NATSListen, c.NATSAuth, c.NATSTLSCert, c.NATSTLSKey = "0.0.0.0:4222", true, certs.ServerCert, certs.ServerKey
		}, nil},
		{"HTTP beyond loopback", func(c *Config) { c.HTTPAddr, c.OperatorTokensFile = "0.0.0.0:8080", "ops" },
			[]string{`CHIME_HTTP_ADDR "0.0.0.0:8080" is beyond loopback without TLS (CHIME_HTTP_TLS_CERT): bearer tokens and callback URLs cross the network in clear text`}},
		{"HTTPS beyond loopback", func(c *Config) {
			c.HTTPAddr, c.OperatorTokensFile, c.HTTPTLSCert, c.HTTPTLSKey = "0.0.0.0:8080", "ops", certs.ServerCert, certs.ServerKey
		}, nil},
	} {
		c := valid()
		tc.set(c)
		got := c.Warnings()
		if len(got) != len(tc.want) {
			t.Errorf("%s: warnings %q, want %q", tc.name, got, tc.want)
			continue
		}
		for i := range got {
			if !strings.HasPrefix(got[i], tc.want[i]) {
				t.Errorf("%s: warning %q, want %q", tc.name, got[i], tc.want[i])
			}
		}
	}
}
