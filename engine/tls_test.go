package engine_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/natsproc"
	"github.com/chime-nats/chime/internal/natsproc/natsproctest"
	"github.com/chime-nats/chime/internal/tlstest"
)

func startTLS(t *testing.T, tlsOpts *engine.EmbeddedTLS) *server.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns, err := engine.StartEmbedded(ctx, engine.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: t.TempDir(), TLS: tlsOpts}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

// plaintextRefused speaks the NATS protocol without TLS to addr: the server
// asks for TLS in its INFO and never answers the PING.
func plaintextRefused(t *testing.T, addr string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(conn)
	info, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("INFO: %v", err)
	}
	if !strings.Contains(info, `"tls_required":true`) {
		t.Errorf("INFO does not require TLS: %s", info)
	}
	if _, err := fmt.Fprint(conn, "CONNECT {\"verbose\":false}\r\nPING\r\n"); err != nil {
		return // closed already
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return // closed: refused
		}
		if strings.HasPrefix(line, "PONG") {
			t.Fatalf("a plaintext client was answered: %q", line)
		}
	}
}

func mustConnect(t *testing.T, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, append(opts, nats.Timeout(5*time.Second), nats.MaxReconnects(0))...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return nc
}

func refused(t *testing.T, what, url string, opts ...nats.Option) {
	t.Helper()
	nc, err := nats.Connect(url, append(opts, nats.Timeout(5*time.Second), nats.MaxReconnects(0))...)
	if err == nil {
		err = nc.Flush()
		nc.Close()
	}
	if err == nil {
		t.Errorf("%s: connected", what)
	} else {
		t.Logf("%s: %v", what, err)
	}
}

// TestEmbeddedTLS: the embedded server's listener serves TLS only; with a
// CA, only clients whose certificate chains to it get in; chime's own
// in-process connection needs no TLS and provisions as ever.
func TestEmbeddedTLS(t *testing.T) {
	certs := tlstest.New(t)
	t.Run("server certificate", func(t *testing.T) {
		ns := startTLS(t, &engine.EmbeddedTLS{CertFile: certs.ServerCert, KeyFile: certs.ServerKey})
		if !strings.HasPrefix(ns.ClientURL(), "tls://") {
			t.Errorf("client URL %s", ns.ClientURL())
		}
		plaintextRefused(t, ns.Addr().String())
		refused(t, "a client that does not trust the CA", ns.ClientURL(), nats.RootCAs(certs.OtherCA))
		mustConnect(t, ns.ClientURL(), nats.RootCAs(certs.CA))
		// A nats:// URL is upgraded, since the server requires TLS.
		mustConnect(t, "nats://"+ns.Addr().String(), nats.RootCAs(certs.CA))
	})
	t.Run("client certificates verified", func(t *testing.T) {
		ns := startTLS(t, &engine.EmbeddedTLS{CertFile: certs.ServerCert, KeyFile: certs.ServerKey, CAFile: certs.CA})
		plaintextRefused(t, ns.Addr().String())
		refused(t, "no client certificate", ns.ClientURL(), nats.RootCAs(certs.CA))
		refused(t, "a client certificate of another CA", ns.ClientURL(), nats.RootCAs(certs.CA), nats.ClientCert(certs.StrangerCert, certs.StrangerKey))
		mustConnect(t, ns.ClientURL(), engine.TLSOptions(certs.CA, certs.ClientCert, certs.ClientKey)...)

		nc, err := engine.Connect(engine.ConnectOptions{Name: "in-process", Embedded: ns}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatalf("in-process connection: %v", err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := engine.Provision(ctx, js, topo); err != nil {
			t.Fatalf("provision in-process: %v", err)
		}
	})
	t.Run("bad files", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := engine.StartEmbedded(ctx, engine.EmbeddedOptions{
			Listen: "127.0.0.1:-1", DataDir: t.TempDir(), TLS: &engine.EmbeddedTLS{CertFile: certs.ServerCert, KeyFile: certs.ClientKey},
		}, slog.New(slog.DiscardHandler))
		if err == nil || !strings.Contains(err.Error(), "TLS") {
			t.Fatalf("a certificate with another's key: %v", err)
		}
	})
}

// TestConnectTLSVerify: chime's connection to an external nats-server
// process that verifies client certificates works with the CA and the
// client certificate, and is refused without either.
func TestConnectTLSVerify(t *testing.T) {
	certs := tlstest.New(t)
	s := natsproctest.New(t, natsproc.Options{
		Config: fmt.Sprintf("tls {\n  cert_file: %q\n  key_file: %q\n  ca_file: %q\n  verify: true\n  timeout: 5\n}\n",
			certs.ServerCert, certs.ServerKey, certs.CA),
		ConnectOptions: engine.TLSOptions(certs.CA, certs.ClientCert, certs.ClientKey),
	})
	s.Start()
	log := slog.New(slog.DiscardHandler)

	plaintextRefused(t, strings.TrimPrefix(s.ClientURL(), "nats://"))
	for _, tc := range []struct {
		what string
		o    engine.ConnectOptions
	}{
		{"no TLS settings", engine.ConnectOptions{}},
		{"the CA without a client certificate", engine.ConnectOptions{CAFile: certs.CA}},
		{"a client certificate without the CA", engine.ConnectOptions{CertFile: certs.ClientCert, KeyFile: certs.ClientKey}},
		{"a client certificate of another CA", engine.ConnectOptions{CAFile: certs.CA, CertFile: certs.StrangerCert, KeyFile: certs.StrangerKey}},
	} {
		tc.o.URL, tc.o.Name = s.ClientURL(), "refused"
		if nc, err := engine.Connect(tc.o, log); err == nil {
			nc.Close()
			t.Errorf("%s: connected", tc.what)
		}
	}

	nc, err := engine.Connect(engine.ConnectOptions{
		URL: s.ClientURL(), Name: "tls", CAFile: certs.CA, CertFile: certs.ClientCert, KeyFile: certs.ClientKey,
	}, log)
	if err != nil {
		t.Fatalf("connect with the CA and a client certificate: %v", err)
	}
	defer nc.Close()
	if st, err := nc.TLSConnectionState(); err != nil || !st.HandshakeComplete {
		t.Fatalf("not a TLS connection: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := engine.Provision(ctx, js, topo); err != nil {
		t.Fatalf("provision over TLS: %v", err)
	}
}
