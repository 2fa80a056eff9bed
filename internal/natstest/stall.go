package natstest

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/internal/testwait"
)

// ReconnectsAfterStall starts a server behind a proxy, connects to it with
// connect (given the proxy's URL), publishes on the connection as fast as
// it takes, then stalls the link the way a network cut does (no reset,
// bytes stop), and fails t unless the connection is given up and made
// again within the given time: a busy client's flusher blocks in the
// write holding the lock its ping timer needs, so pings alone would not
// notice.
func ReconnectsAfterStall(t testing.TB, within time.Duration, connect func(url string) (*nats.Conn, error)) {
	t.Helper()
	ns := Server(t)
	p := newStallProxy(t, ns.Addr().String())
	nc, err := connect("nats://" + p.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	done := make(chan struct{})
	var pub sync.WaitGroup
	pub.Go(func() {
		data := make([]byte, 64<<10)
		for {
			select {
			case <-done:
				return
			default:
			}
			if nc.Publish("stall.load", data) != nil {
				time.Sleep(10 * time.Millisecond)
			}
		}
	})
	defer func() { close(done); pub.Wait() }()
	time.Sleep(200 * time.Millisecond)
	p.stall()
	testwait.Eventually(t, within, func() bool { return nc.Stats().Reconnects > 0 && nc.IsConnected() },
		"reconnected after the stall")
}

// stallProxy forwards TCP connections to a server until stall: then its
// current connections stop moving bytes either way without closing, as a
// link cut by the network does. Connections accepted later flow.
type stallProxy struct {
	ln      net.Listener
	target  string
	stalled chan struct{} // closed by stall
	stopped chan struct{} // closed by close
	mu      sync.Mutex
	conns   []net.Conn
	wg      sync.WaitGroup
	once    sync.Once
}

func newStallProxy(t testing.TB, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, target: target, stalled: make(chan struct{}), stopped: make(chan struct{})}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *stallProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		var gate chan struct{} // nil: never stalls
		select {
		case <-p.stalled:
		default:
			gate = p.stalled
		}
		p.wg.Go(func() { p.pipe(s, c, gate) })
		p.wg.Go(func() { p.pipe(c, s, gate) })
	}
}

// pipe copies from src to dst until either closes, or until gate closes:
// then it stops reading, holding the connections open, until the proxy
// closes.
func (p *stallProxy) pipe(dst, src net.Conn, gate chan struct{}) {
	buf := make([]byte, 32<<10)
	for {
		select {
		case <-gate:
			<-p.stopped
			return
		default:
		}
		src.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil && !isTimeout(err) {
			return // closed, or EOF
		}
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func (p *stallProxy) stall() { close(p.stalled) }

func (p *stallProxy) close() {
	p.once.Do(func() {
		close(p.stopped)
		p.ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
}
