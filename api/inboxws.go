package api

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/coder/websocket"

	"github.com/chime-nats/chime/deliveries"
	"github.com/chime-nats/chime/subjects"
)

// CodeUpgradeRequired answers a plain request to a WebSocket route, or
// one of a WebSocket version other than 13 (HTTP only, 426).
const CodeUpgradeRequired = "upgrade_required"

// WebSocket bounds. The client sends nothing but control frames (a pong,
// a close), at most 125 bytes each: a data frame ends the feed, and no
// frame over wsReadLimit is read. A frame, or a ping's round trip, that
// does not get through within wsWriteTimeout is a client not reading, as
// for the event streams; pings go every keepalive while no delivery does.
const (
	wsReadLimit    = 512
	wsWriteTimeout = sseWriteTimeout
)

// inboxWebSocket serves GET /api/agents/{id}/inbox/ws: the agent's
// deliveries (inboxFeed, the read of the Server-Sent Events route), one
// WebSocket text frame each, until the client leaves, the gateway stops or
// a read fails; the client resumes with ?since=<last seq> (or the
// Last-Event-ID header) and loses nothing the stream still holds. A frame
// is {seq, stored_at, envelope} (?format=json, the default) or the
// delivery's one-line text (?format=text, as chime inbox watch prints
// it). Frames do not move the cursor, as the events do not: the agent acks
// what it handled. Everything that can be refused is refused before the
// upgrade, as a JSON error with its status.
func (o *Operations) inboxWebSocket(w http.ResponseWriter, r *http.Request) {
	if err := webSocketHandshake(w, r); err != nil {
		writeError(w, err)
		return
	}
	frame, err := frameFormat(r)
	if err != nil {
		writeError(w, err)
		return
	}
	fd, err := o.openInboxFeed(r, "inbox.ws")
	if err != nil {
		writeError(w, err)
		return
	}
	defer fd.Close()
	c, err := acceptWebSocket(w, r)
	if err != nil {
		o.log.Debug("inbox websocket not accepted", "agent_id", fd.agentID, "err", err)
		return
	}
	// The client sends nothing but control frames: reading them answers
	// its pings and takes its pongs and its close. ctx ends when the feed
	// does or the client goes (the request's context does not see that,
	// the connection being hijacked). Not CloseRead, which waits for
	// itself for 15 s when it refuses a data frame.
	ctx, cancel := context.WithCancel(fd.ctx)
	defer cancel()
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer cancel()
		if _, _, err := c.Read(context.Background()); err == nil {
			_ = c.Close(websocket.StatusPolicyViolation, "this feed takes no messages")
		}
	}()
	defer func() { _ = c.CloseNow(); <-read }()
	for {
		list, err := fd.next(ctx)
		switch {
		case fd.ctx.Err() != nil: // the gateway stops or the token was revoked
			_ = c.Close(websocket.StatusGoingAway, "the feed ended: resume with ?since=<last seq>")
			return
		case ctx.Err() != nil: // the client left
			return
		case err != nil:
			o.log.Debug("inbox websocket ended", "agent_id", fd.agentID, "after", fd.After(), "err", err)
			_ = c.Close(websocket.StatusTryAgainLater, "the read failed: resume with ?since=<last seq>")
			return
		case len(list) == 0:
			pctx, cancel := context.WithTimeout(ctx, wsWriteTimeout)
			err := c.Ping(pctx)
			cancel()
			if err != nil {
				return
			}
		}
		for _, d := range list {
			wctx, cancel := context.WithTimeout(ctx, wsWriteTimeout)
			err := c.Write(wctx, websocket.MessageText, frame(d))
			cancel()
			if err != nil {
				return
			}
		}
	}
}

// frameFormat is how a frame shows a delivery: ?format=json (the default)
// or text.
func frameFormat(r *http.Request) (func(deliveries.Delivery) []byte, error) {
	switch f := r.URL.Query().Get("format"); f {
	case "", "json":
		return func(d deliveries.Delivery) []byte { return encode(d) }, nil
	case "text":
		return deliveries.Line, nil
	default:
		return nil, &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "format must be json or text, not " + strconv.Quote(f)}
	}
}

// webSocketHandshake refuses a request that is no WebSocket handshake
// chime accepts, with the reason as a JSON error (the WebSocket library
// would answer in plain text): no upgrade asked for, a version other than
// 13, a bad key, or an Origin other than the host (a page elsewhere
// riding a browser's access to a chime without tokens; a client that is
// no browser sends none).
func webSocketHandshake(w http.ResponseWriter, r *http.Request) error {
	if !headerHas(r.Header, "Connection", "upgrade") || !headerHas(r.Header, "Upgrade", "websocket") {
		w.Header().Set("Upgrade", "websocket")
		w.Header().Set("Connection", "Upgrade")
		return &subjects.Error{Code: CodeUpgradeRequired, Status: http.StatusUpgradeRequired,
			Message: "this route is a WebSocket: the request must ask for an upgrade (Connection: Upgrade, Upgrade: websocket)"}
	}
	if v := r.Header.Get("Sec-WebSocket-Version"); v != "13" {
		w.Header().Set("Sec-WebSocket-Version", "13")
		return &subjects.Error{Code: CodeUpgradeRequired, Status: http.StatusUpgradeRequired,
			Message: "WebSocket version 13 is required, not " + strconv.Quote(v)}
	}
	if keys := r.Header.Values("Sec-WebSocket-Key"); len(keys) != 1 || !validKey(keys[0]) {
		return &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "Sec-WebSocket-Key must be one 16-byte value in base64"}
	}
	if origin := r.Header.Get("Origin"); origin != "" {
		if u, err := url.Parse(origin); err != nil || !strings.EqualFold(u.Host, r.Host) {
			return &subjects.Error{Code: subjects.CodeForbidden, Message: "a WebSocket from another origin (" + strconv.Quote(origin) + ") is refused"}
		}
	}
	return nil
}

func validKey(k string) bool {
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(k))
	return err == nil && len(b) == 16
}

// headerHas reports whether header name lists token (comma-separated, any
// case), as Connection: keep-alive, Upgrade does.
func headerHas(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// acceptWebSocket upgrades the connection. net/http lifts the gateway's
// read and write deadlines, which bound a whole request, from a hijacked
// connection (TestWebSocketOutlivesTheGatewayTimeouts holds it to that):
// each write and ping is bounded on its own instead (wsWriteTimeout), the
// read side by the pings. The client may send no frame over wsReadLimit.
func acceptWebSocket(w http.ResponseWriter, r *http.Request) (*websocket.Conn, error) {
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return nil, err
	}
	c.SetReadLimit(wsReadLimit)
	return c, nil
}
