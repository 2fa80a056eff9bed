package api

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/chime-nats/chime/subjects"
)

// Event stream timing: a comment every keepalive holds proxies and the
// client's connection open; a write that has not gone out within
// sseWriteTimeout is a client not reading, which is dropped.
const (
	keepalive       = 15 * time.Second
	sseWriteTimeout = 10 * time.Second
)

// maxBatch is how much a stream gathers into one write.
const maxBatch = 64 << 10

// eventStream writes Server-Sent Events to one client: events are
// gathered with add and comment, and go out together with send.
type eventStream struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf []byte
}

// openStream takes one of the request's principal's event stream places
// (CHIME_MAX_STREAMS_PER_PRINCIPAL) and returns the stream's context,
// which ends with the request, when the gateway stops, or when the
// principal's token is revoked (EndStreams); release gives the place back
// when the stream ends. A refusal is counted, not logged: a client
// retrying in a loop would flood the log.
func (o *Operations) openStream(r *http.Request) (_ context.Context, release func(), err error) {
	principal := requestPrincipal(r)
	free, err := o.quotas.OpenStream(principal)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := streamContext(r)
	forget := o.streams.add(principal, cancel)
	return ctx, func() { forget(); cancel(); free() }, nil
}

// EndStreams ends every event stream this replica serves to principal (an
// access.Principal's Name): its token was revoked.
func (o *Operations) EndStreams(principal string) int { return o.streams.end(principal) }

// openStreams are event streams' cancels, by principal.
type openStreams struct {
	mu          sync.Mutex
	next        uint64
	byPrincipal map[string]map[uint64]context.CancelFunc
}

func (s *openStreams) add(principal string, cancel context.CancelFunc) (forget func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	id := s.next
	if s.byPrincipal[principal] == nil {
		s.byPrincipal[principal] = map[uint64]context.CancelFunc{}
	}
	s.byPrincipal[principal][id] = cancel
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.byPrincipal[principal], id)
		if len(s.byPrincipal[principal]) == 0 {
			delete(s.byPrincipal, principal)
		}
	}
}

func (s *openStreams) end(principal string) int {
	s.mu.Lock()
	cancels := s.byPrincipal[principal]
	delete(s.byPrincipal, principal)
	s.mu.Unlock()
	for _, cancel := range cancels {
		cancel()
	}
	return len(cancels)
}

// startEventStream opens an event stream: its headers and a ": connected"
// comment go out at once, so the client knows it is open before the first
// event. The gateway's write timeout bounds a whole reply, which a stream
// never finishes: it is lifted here, and each send gets its own deadline
// instead. nil means the stream ended before it began (the error, if the
// connection cannot stream, is answered).
func startEventStream(w http.ResponseWriter) *eventStream {
	rc := http.NewResponseController(w)
	if err := rc.SetWriteDeadline(time.Now().Add(sseWriteTimeout)); err != nil {
		writeError(w, &subjects.Error{Code: subjects.CodeInternal, Message: "this connection cannot stream"})
		return nil
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // a buffering proxy would hold events back
	w.WriteHeader(http.StatusOK)
	s := &eventStream{w: w, rc: rc, buf: make([]byte, 0, 4096)}
	s.comment("connected")
	if !s.send() {
		return nil
	}
	return s
}

// add gathers one event: its sequence as the id, its name, and data, one
// line of JSON (encode's and the feeds' are compact).
func (s *eventStream) add(id uint64, name string, data []byte) {
	s.buf = append(s.buf, "id: "...)
	s.buf = strconv.AppendUint(s.buf, id, 10)
	s.buf = append(s.buf, "\nevent: "...)
	s.buf = append(s.buf, name...)
	s.buf = append(s.buf, "\ndata: "...)
	s.buf = append(s.buf, data...)
	s.buf = append(s.buf, "\n\n"...)
}

// comment gathers a comment line, which clients ignore.
func (s *eventStream) comment(text string) {
	s.buf = append(s.buf, ": "...)
	s.buf = append(s.buf, text...)
	s.buf = append(s.buf, "\n\n"...)
}

// full reports a batch that should go out before more is gathered.
func (s *eventStream) full() bool { return len(s.buf) >= maxBatch }

// send writes what was gathered, within sseWriteTimeout, and flushes it;
// false means the client is gone or not reading.
func (s *eventStream) send() bool {
	if err := s.rc.SetWriteDeadline(time.Now().Add(sseWriteTimeout)); err != nil {
		return false
	}
	if _, err := s.w.Write(s.buf); err != nil {
		return false
	}
	s.buf = s.buf[:0]
	return s.rc.Flush() == nil
}

// resumeAfter is where a stream resumes: after the Last-Event-ID header
// (where a reconnecting client stopped), else after ?since; ok is false
// for neither.
func resumeAfter(r *http.Request) (after uint64, ok bool, err error) {
	for _, v := range []string{r.Header.Get("Last-Event-ID"), r.URL.Query().Get("since")} {
		if v == "" {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, false, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "since (or Last-Event-ID) must be a sequence number, not " + strconv.Quote(v)}
		}
		return n, true, nil
	}
	return 0, false, nil
}

// streamContext is a stream's context: it ends with the request (the
// client left) or when the gateway stops (gatewayStopping). Shutdown waits
// for connections to go idle and cancels no request, so without this a
// stream would hold the shutdown to its deadline.
func streamContext(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(r.Context())
	if stopping := gatewayStopping(r.Context()); stopping != nil {
		go func() {
			select {
			case <-stopping:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	return ctx, cancel
}

// stoppingKey holds, in a request's context, the channel the gateway
// closes when it shuts down: streams end then, while other requests are
// let finish.
type stoppingKey struct{}

func gatewayStopping(ctx context.Context) <-chan struct{} {
	c, _ := ctx.Value(stoppingKey{}).(chan struct{})
	return c // nil outside a Gateway: never closed
}
