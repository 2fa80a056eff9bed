package directget

import (
	"context"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"
)

// Replies routes the replies of many concurrent batches of one connection:
// one subscription to a wildcard under one inbox for them all, where a
// subscription of each batch's own costs a subscribe and an unsubscribe
// (two protocol messages and the server's interest updates) per request.
// It subscribes at the first batch and stays subscribed for the
// connection's life. It is safe for concurrent use.
type Replies struct {
	nc      *nats.Conn
	mu      sync.Mutex
	sub     *nats.Subscription // subscribed at the first batch
	prefix  string             // <inbox>.
	next    uint64
	waiting map[string]chan *nats.Msg
}

// NewReplies returns the reply routing of nc's batches.
func NewReplies(nc *nats.Conn) *Replies {
	return &Replies{nc: nc, waiting: map[string]chan *nats.Msg{}}
}

// open returns a reply subject of its own and the channel its replies
// come on, which holds n (more are dropped: a request's replies are
// bounded), and done, which forgets them.
func (rs *Replies) open(n int) (string, <-chan *nats.Msg, func(), error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.sub == nil {
		prefix := rs.nc.NewInbox() + "."
		sub, err := rs.nc.Subscribe(prefix+"*", rs.route)
		if err != nil {
			return "", nil, nil, err
		}
		rs.sub, rs.prefix = sub, prefix
	}
	rs.next++
	subject := rs.prefix + strconv.FormatUint(rs.next, 36)
	c := make(chan *nats.Msg, n)
	rs.waiting[subject] = c
	return subject, c, func() {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		delete(rs.waiting, subject)
	}, nil
}

// route passes a reply to its request; one for a request that ended is
// dropped.
func (rs *Replies) route(m *nats.Msg) {
	rs.mu.Lock()
	c := rs.waiting[m.Subject]
	rs.mu.Unlock()
	select {
	case c <- m: // a nil c (the request ended) is never ready
	default:
	}
}

// inbox is where one batch's replies come, and how to read the next.
type inbox struct {
	subject string
	msg     func(context.Context) (*nats.Msg, error)
}

// subscribe returns the inbox of one batch of at most n replies, and
// done, which ends it: a subject of the shared Replies when s has them,
// else a subscription of its own.
func (s *Stream) subscribe(n int) (*inbox, func(), error) {
	if s.replies != nil {
		subject, c, done, err := s.replies.open(n)
		if err != nil {
			return nil, nil, err
		}
		return &inbox{subject: subject, msg: func(ctx context.Context) (*nats.Msg, error) {
			select {
			case m := <-c:
				return m, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}}, done, nil
	}
	subject := s.nc.NewInbox()
	sub, err := s.nc.SubscribeSync(subject)
	if err != nil {
		return nil, nil, err
	}
	return &inbox{subject: subject, msg: sub.NextMsgWithContext}, func() { _ = sub.Unsubscribe() }, nil
}
