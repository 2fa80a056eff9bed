package e2e_test

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/internal/tlstest"
)

// TestServeTLS: `chime serve` with TLS on the embedded server's listener
// (client certificates verified against the CA), NATS authorization and
// HTTPS. The CLI reaches it with CHIME_NATS_TLS_CA and its client
// certificate, and is refused without the certificate; plaintext NATS and
// HTTP get nothing; a trigger URL says https and a callback to it works.
func TestServeTLS(t *testing.T) {
	certs := tlstest.New(t)
	op := "op-tls-" + strings.Repeat("x", 16)
	sum := sha256.Sum256([]byte(op))
	ops := filepath.Join(t.TempDir(), "operators")
	if err := os.WriteFile(ops, []byte(hex.EncodeToString(sum[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	natsAddr := freeAddr(t)
	p := spawnServe(t, "tls", freeAddr(t), "CHIME_NATS_AUTH=true", "CHIME_NATS_LISTEN="+natsAddr,
		"CHIME_DATA_DIR="+t.TempDir(), "CHIME_OPERATOR_TOKENS_FILE="+ops,
		"CHIME_NATS_TLS_CERT="+certs.ServerCert, "CHIME_NATS_TLS_KEY="+certs.ServerKey, "CHIME_NATS_TLS_CA="+certs.CA,
		"CHIME_HTTP_TLS_CERT="+certs.ServerCert, "CHIME_HTTP_TLS_KEY="+certs.ServerKey)
	pem, err := os.ReadFile(certs.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	defer tr.CloseIdleConnections()
	p.https = &http.Client{Transport: tr, Timeout: 10 * time.Second}
	p.waitReady(t) // over https

	if res, err := http.Get("http://" + p.httpAddr + "/readyz"); err == nil {
		res.Body.Close()
		if res.StatusCode == http.StatusOK {
			t.Error("readyz answered in plain HTTP")
		}
	}
	if nc, err := nats.Connect("nats://"+natsAddr, nats.Token(op), nats.MaxReconnects(0), nats.Timeout(5*time.Second)); err == nil {
		nc.Close()
		t.Error("a NATS client without the CA and a client certificate connected")
	}

	t.Setenv("CHIME_NATS_TOKEN", op)
	t.Setenv("CHIME_NATS_TLS_CA", certs.CA)
	t.Setenv("CHIME_NATS_TLS_CLIENT_CERT", certs.ClientCert)
	t.Setenv("CHIME_NATS_TLS_CLIENT_KEY", certs.ClientKey)
	tm := cliTimer(t, natsAddr, "timer", "create", "--after-ms", "60000", "--agent", "alice")
	if got := cliTimerList(t, natsAddr, "alice"); len(got) != 1 || got[0].ID != tm.ID {
		t.Fatalf("timer list over TLS: %+v, want %s", got, tm.ID)
	}

	out, errOut, code := chimeCLI(t, natsAddr, "agent", "start", "--agent", "alice")
	if code != 0 {
		t.Fatalf("agent start: exit %d: %s", code, errOut)
	}
	var started callbacks.LifecycleReply
	if err := json.Unmarshal([]byte(out), &started); err != nil {
		t.Fatalf("agent start printed %q: %v", out, err)
	}
	var wake string
	for _, tr := range started.Triggers {
		if tr.Mode == callbacks.ModeWakeHint {
			wake = tr.TriggerURL
		}
	}
	if !strings.HasPrefix(wake, "https://"+p.httpAddr+"/api/callbacks/wake/") {
		t.Fatalf("wake trigger URL %.40q..., want https://%s/api/callbacks/wake/...", wake, p.httpAddr)
	}
	res, err := p.https.Post(wake, "application/json", strings.NewReader(`{"text":"deployed"}`))
	if err != nil {
		t.Fatalf("callback over https: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("callback over https: %d", res.StatusCode)
	}

	t.Setenv("CHIME_NATS_TLS_CLIENT_CERT", "")
	t.Setenv("CHIME_NATS_TLS_CLIENT_KEY", "")
	if _, errOut, code := chimeCLI(t, natsAddr, "timer", "list", "--agent", "alice"); code == 0 {
		t.Fatalf("timer list without a client certificate: exit 0: %s", errOut)
	} else {
		t.Logf("without a client certificate: %s", strings.TrimSpace(errOut))
	}
}
