package natstest

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// freePorts finds n ports nothing listens on right now.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// Cluster starts an in-process JetStream cluster of three servers on
// 127.0.0.1 (n1, n2, n3), shut down when the test ends, and returns their
// client URLs.
func Cluster(t testing.TB) []string {
	t.Helper()
	ports := freePorts(t, 3)
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	var urls []string
	for i, p := range ports {
		ns, err := server.NewServer(&server.Options{
			ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: -1, NoSigs: true,
			JetStream: true, StoreDir: t.TempDir(),
			Cluster: server.ClusterOpts{Name: "natstest", Host: "127.0.0.1", Port: p},
			Routes:  server.RoutesFromStr(strings.Join(routes, ",")),
		})
		if err != nil {
			t.Fatal(err)
		}
		ns.Start()
		t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
		if !ns.ReadyForConnections(5 * time.Second) {
			t.Fatalf("server n%d not ready", i+1)
		}
		urls = append(urls, ns.ClientURL())
	}
	return urls
}

// ClusterKV starts a Cluster and returns JetStream on a connection to all
// of it (reconnecting at once, as chime's does) and an R3 bucket made on
// it, once the cluster's meta leader, elected a moment after the routes
// form, takes the request.
func ClusterKV(t testing.TB, bucket string) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	js := connect(t, strings.Join(Cluster(t), ","), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, Replicas: 3})
		cancel()
		if err == nil {
			return js, kv
		}
		if time.Now().After(deadline) {
			t.Fatalf("create bucket %s: %v", bucket, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
