package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
)

// validateTLS checks the TLS files: each certificate has its key, every
// file is readable, each pair matches, and a CA file holds certificates.
func (c *Config) validateTLS() error {
	embedded := c.NATSURL == ""
	if !embedded && (c.NATSTLSCert != "" || c.NATSTLSKey != "") {
		return fmt.Errorf("config: CHIME_NATS_TLS_CERT and CHIME_NATS_TLS_KEY are the embedded server's, and CHIME_NATS_URL runs none: " +
			"chime's client certificate for CHIME_NATS_URL is CHIME_NATS_TLS_CLIENT_CERT and CHIME_NATS_TLS_CLIENT_KEY")
	}
	if embedded && c.NATSTLSCA != "" && c.NATSTLSCert == "" {
		return fmt.Errorf("config: CHIME_NATS_TLS_CA (the CA client certificates must chain to) needs CHIME_NATS_TLS_CERT: the embedded server verifies clients only over TLS")
	}
	for _, p := range []struct{ cert, key, certVar, keyVar string }{
		{c.NATSTLSCert, c.NATSTLSKey, "CHIME_NATS_TLS_CERT", "CHIME_NATS_TLS_KEY"},
		{c.NATSTLSClientCert, c.NATSTLSClientKey, "CHIME_NATS_TLS_CLIENT_CERT", "CHIME_NATS_TLS_CLIENT_KEY"},
		{c.HTTPTLSCert, c.HTTPTLSKey, "CHIME_HTTP_TLS_CERT", "CHIME_HTTP_TLS_KEY"},
	} {
		if _, err := keyPair(p.cert, p.key, p.certVar, p.keyVar); err != nil {
			return err
		}
	}
	if c.HTTPTLSCert != "" && c.HTTPAddr == "" {
		return fmt.Errorf("config: CHIME_HTTP_TLS_CERT is set but CHIME_HTTP_ADDR is empty: there is no HTTP gateway to serve it")
	}
	if c.NATSTLSCA != "" {
		if _, err := caPool(c.NATSTLSCA, "CHIME_NATS_TLS_CA"); err != nil {
			return err
		}
	}
	return nil
}

// keyPair loads a certificate and its key, naming the variable at fault;
// both empty is no pair (nil, nil).
func keyPair(cert, key, certVar, keyVar string) (*tls.Certificate, error) {
	switch {
	case cert == "" && key == "":
		return nil, nil
	case key == "":
		return nil, fmt.Errorf("config: %s is set without %s: a certificate needs its private key", certVar, keyVar)
	case cert == "":
		return nil, fmt.Errorf("config: %s is set without %s: a private key needs its certificate", keyVar, certVar)
	}
	certPEM, err := os.ReadFile(cert)
	if err != nil {
		return nil, fmt.Errorf("config: %s: %w", certVar, err)
	}
	keyPEM, err := os.ReadFile(key)
	if err != nil {
		// The error names the file, never its content.
		return nil, fmt.Errorf("config: %s: %w", keyVar, err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("config: %s %q and %s %q are not a PEM certificate and its private key: %w", certVar, cert, keyVar, key, err)
	}
	return &pair, nil
}

// caPool reads a file of PEM CA certificates.
func caPool(file, name string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("config: %s: %w", name, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("config: %s %q holds no PEM certificate", name, file)
	}
	return pool, nil
}

// HTTPTLS is the HTTP gateway's TLS configuration, nil without
// CHIME_HTTP_TLS_CERT. The certificate is read once: a renewed one takes
// a restart.
func (c *Config) HTTPTLS() (*tls.Config, error) {
	pair, err := keyPair(c.HTTPTLSCert, c.HTTPTLSKey, "CHIME_HTTP_TLS_CERT", "CHIME_HTTP_TLS_KEY")
	if err != nil || pair == nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{*pair}, MinVersion: tls.VersionTLS12}, nil
}

// Warnings are what this configuration allows but an operator should
// know at start: tokens that would cross the network in clear text.
func (c *Config) Warnings() []string {
	var w []string
	if c.NATSURL == "" && c.NATSAuth && c.NATSTLSCert == "" {
		if host, _, err := net.SplitHostPort(c.NATSListen); err == nil && !Loopback(host) {
			w = append(w, fmt.Sprintf("CHIME_NATS_LISTEN %q is beyond loopback without TLS (CHIME_NATS_TLS_CERT): "+
				"every client's token crosses the network in clear text, for anyone on the path to read and use", c.NATSListen))
		}
	}
	if c.HTTPAddr != "" && c.HTTPTLSCert == "" {
		if host, _, err := net.SplitHostPort(c.HTTPAddr); err == nil && !Loopback(host) {
			w = append(w, fmt.Sprintf("CHIME_HTTP_ADDR %q is beyond loopback without TLS (CHIME_HTTP_TLS_CERT): "+
				"bearer tokens and callback URLs cross the network in clear text unless only a TLS-terminating proxy (an ingress) reaches it", c.HTTPAddr))
		}
	}
	return w
}
