package replica_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/natsproc"
	"github.com/chime-nats/chime/internal/natsproc/natsproctest"
	"github.com/chime-nats/chime/internal/tlstest"
	"github.com/chime-nats/chime/replica"
	"github.com/chime-nats/chime/subjects"
)

// httpsClient trusts only the test's CA.
func httpsClient(t *testing.T, caFile string) *http.Client {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// TestTLSExternalNATSAndHTTPS: a replica reaches a nats-server process that
// verifies client certificates with CHIME_NATS_TLS_CA and its client
// certificate, and serves HTTPS: /readyz and a callback over https with the
// CA, trigger URLs that say https, no answer in plain HTTP.
func TestTLSExternalNATSAndHTTPS(t *testing.T) {
	certs := tlstest.New(t)
	clientTLS := engine.TLSOptions(certs.CA, certs.ClientCert, certs.ClientKey)
	s := natsproctest.New(t, natsproc.Options{
		Config: fmt.Sprintf("tls {\n  cert_file: %q\n  key_file: %q\n  ca_file: %q\n  verify: true\n  timeout: 5\n}\n",
			certs.ServerCert, certs.ServerKey, certs.CA),
		ConnectOptions: clientTLS,
	})
	s.Start()

	cfg := &config.Config{
		NATSURL: s.ClientURL(), NATSTLSCA: certs.CA, NATSTLSClientCert: certs.ClientCert, NATSTLSClientKey: certs.ClientKey,
		HTTPAddr: "127.0.0.1:0", HTTPTLSCert: certs.ServerCert, HTTPTLSKey: certs.ServerKey,
		JSReplicas: 1, ReplicaID: "tls", Shards: 4, LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour,
		DedupWindow: time.Minute, NotificationsMax: 100, LogLevel: "info", LogFormat: "text",
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := replica.Start(ctx, cfg, slog.New(slog.NewTextHandler(t.Output(), nil)), "0.0.0-test")
	if err != nil {
		t.Fatalf("start against a TLS server that verifies clients: %v", err)
	}
	defer r.Stop(context.Background())

	base := "https://" + r.HTTPAddr()
	hc := httpsClient(t, certs.CA)
	res, err := hc.Get(base + "/readyz")
	if err != nil {
		t.Fatalf("readyz over https: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("readyz over https: %d", res.StatusCode)
	}
	if res, err := http.Get("http://" + r.HTTPAddr() + "/readyz"); err == nil {
		res.Body.Close()
		if res.StatusCode == http.StatusOK {
			t.Errorf("readyz answered in plain HTTP")
		}
	}
	if _, err := httpsClient(t, certs.OtherCA).Get(base + "/readyz"); err == nil {
		t.Errorf("a client that does not trust the CA got an answer")
	}

	// A chime request over TLS, as an agent.
	nc, err := nats.Connect(s.ClientURL(), append(clientTLS, nats.Timeout(5*time.Second))...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(nc, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateTimer(ctx, 60_000, 0, "over tls"); err != nil {
		t.Fatalf("timer create over TLS: %v", err)
	}
	inbox, err := nc.SubscribeSync(subjects.Inbox("alice"))
	if err != nil {
		t.Fatal(err)
	}

	// A callback over https: the trigger URL says https, and works.
	res, err = hc.Post(base+"/api/control/agents/alice/start", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("start alice: %d", res.StatusCode)
	}
	res, err = hc.Post(base+"/api/control/agents/alice/triggers", "application/json", strings.NewReader(`{"delivery_mode":"wake_hint"}`))
	if err != nil {
		t.Fatal(err)
	}
	var trigger callbacks.TriggerView
	err = json.NewDecoder(res.Body).Decode(&trigger)
	res.Body.Close()
	if err != nil || res.StatusCode != http.StatusCreated {
		t.Fatalf("create a trigger: %d %v", res.StatusCode, err)
	}
	wake := trigger.TriggerURL
	if !strings.HasPrefix(wake, base+"/api/callbacks/wake/") {
		t.Fatalf("wake trigger URL %.40q..., want it under %s", wake, base)
	}
	res, err = hc.Post(wake, "application/json", bytes.NewReader([]byte(`{"text":"build done"}`)))
	if err != nil {
		t.Fatalf("callback over https: %v", err)
	}
	var reply callbacks.CallbackReply
	err = json.NewDecoder(res.Body).Decode(&reply)
	res.Body.Close()
	if err != nil || res.StatusCode != http.StatusOK || !reply.OK {
		t.Fatalf("callback over https: %d %+v %v", res.StatusCode, reply, err)
	}
	m, err := inbox.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no delivery after the callback: %v", err)
	}
	if kind := m.Header.Get(subjects.HeaderKind); kind != subjects.KindWakeHint {
		t.Errorf("delivery kind %q", kind)
	}
}
