// Package tlstest makes the certificates TLS tests run with: a CA of the
// test's own, a server certificate for 127.0.0.1 and localhost, and a
// client certificate, all signed by that CA and written as PEM files to a
// temporary directory.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Files are the PEM files of one test's certificates.
type Files struct {
	Dir string
	// CA is the certificate of the CA that signed the others.
	CA string
	// ServerCert and ServerKey are valid for 127.0.0.1, ::1 and localhost.
	ServerCert, ServerKey string
	// ClientCert and ClientKey are a client certificate (CN chime-client).
	ClientCert, ClientKey string
	// OtherCA is a CA that signed none of them: a client trusting it
	// refuses the server.
	OtherCA string
	// StrangerCert and StrangerKey are a client certificate signed by
	// OtherCA: a server verifying clients against CA refuses it.
	StrangerCert, StrangerKey string
}

// New makes a CA, server and client certificates valid for an hour, in
// t.TempDir().
func New(t testing.TB) *Files {
	t.Helper()
	dir := t.TempDir()
	f := &Files{Dir: dir}
	ca, caKey := newCA(t, "chime test CA")
	f.CA = writeCert(t, dir, "ca.pem", ca.Raw)
	f.ServerCert, f.ServerKey = leaf(t, dir, "server", ca, caKey, x509.ExtKeyUsageServerAuth)
	f.ClientCert, f.ClientKey = leaf(t, dir, "client", ca, caKey, x509.ExtKeyUsageClientAuth)
	other, otherKey := newCA(t, "some other CA")
	f.OtherCA = writeCert(t, dir, "other-ca.pem", other.Raw)
	f.StrangerCert, f.StrangerKey = leaf(t, dir, "stranger", other, otherKey, x509.ExtKeyUsageClientAuth)
	return f
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func newCA(t testing.TB, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// leaf writes a certificate for 127.0.0.1, ::1 and localhost signed by ca,
// and its key; it returns their paths.
func leaf(t testing.TB, dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage x509.ExtKeyUsage) (string, string) {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: "chime-" + name},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath := writeCert(t, dir, name+".pem", der)
	keyPath := filepath.Join(dir, name+"-key.pem")
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certPath, keyPath
}

func writeCert(t testing.TB, dir, name string, der []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
