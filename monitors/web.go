package monitors

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/chime-nats/chime/internal/backoff"
	"github.com/chime-nats/chime/subjects"
)

// The ws and http sources make chime's server open a connection an agent
// names, so what they may open is the operator's to say, by URL prefix
// (CHIME_MONITOR_URLS), and nothing the agent gives reaches the request
// but the URL: no header, no credential, no method, no body.

// CodeURLNotAllowed refuses a URL an agent may not watch.
const CodeURLNotAllowed = "monitor_url_not_allowed"

// Limits of the ws and http sources.
const (
	// MaxURLLen bounds a watched URL.
	MaxURLLen = 2048
	// MaxRedirects bounds the redirects a poll or a WebSocket's handshake
	// follows, each within the allowed prefixes.
	MaxRedirects = 3
	// WebTimeout bounds a poll's request and a WebSocket's dial.
	WebTimeout = 10 * time.Second
	// MaxWebBody bounds what is read of a poll's body or of one frame:
	// the rest is cut, and a line says so.
	MaxWebBody = 64 << 10
	// WSRetryFor is how long a WebSocket may fail (dials refused, a
	// connection broken again and again) before its monitor ends.
	WSRetryFor = time.Minute
	// maxPollLines bounds the lines one poll delivers: beyond the bucket's
	// burst they would only be suppressed, each batch a CAS.
	maxPollLines = 500
)

// URLPolicy says which URLs an agent's monitors may open: those under one
// of the operator's prefixes (CHIME_MONITOR_URLS), compared parsed
// (scheme, host, port, path on a segment boundary). The zero policy
// allows none.
type URLPolicy struct {
	allow []urlPrefix
}

// urlPrefix is one allowed prefix, parsed; path may hold AgentPlaceholder.
type urlPrefix struct {
	raw, scheme, host, port, path string
}

// webSchemes are the schemes each source opens. A ws source opens ws and
// wss only: an https prefix does not open wss of its host (a WebSocket
// endpoint is a different thing to open than a page), so an operator
// lists ws and wss prefixes explicitly.
var webSchemes = map[string][]string{SourceWS: {"ws", "wss"}, SourceHTTP: {"http", "https"}}

// NewURLPolicy parses the operator's prefixes. A prefix that cannot be
// compared safely (another scheme, no host, user info, a query or a
// fragment, {agent} outside the path, dot segments) is an error, so that
// a mistake in the configuration fails at start.
func NewURLPolicy(allow []string) (URLPolicy, error) {
	var p URLPolicy
	for _, a := range allow {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		pre, err := parsePrefix(a)
		if err != nil {
			return URLPolicy{}, fmt.Errorf("monitors: allowed URL %q: %w", a, err)
		}
		p.allow = append(p.allow, pre)
	}
	return p, nil
}

func parsePrefix(a string) (urlPrefix, error) {
	host, _, _ := strings.Cut(strings.TrimPrefix(a[strings.Index(a, ":")+1:], "//"), "/")
	if strings.Contains(host, AgentPlaceholder) {
		return urlPrefix{}, errors.New(AgentPlaceholder + " may stand in the path only")
	}
	u, err := url.Parse(a)
	switch {
	case err != nil:
		return urlPrefix{}, err
	case !slices.Contains([]string{"http", "https", "ws", "wss"}, u.Scheme):
		return urlPrefix{}, errors.New("the scheme must be http, https, ws or wss")
	case u.Host == "" || u.Hostname() == "":
		return urlPrefix{}, errors.New("a host is required")
	case u.User != nil:
		return urlPrefix{}, errors.New("user info is not allowed")
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(a, "#"):
		return urlPrefix{}, errors.New("a query or a fragment is not allowed")
	case badPath(u):
		return urlPrefix{}, errors.New("the path must have no . or .. segments, encoded slashes or backslashes")
	}
	return urlPrefix{raw: a, scheme: u.Scheme, host: strings.ToLower(u.Hostname()), port: portOf(u), path: u.Path}, nil
}

// portOf is u's port, its scheme's default when it names none.
func portOf(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	switch u.Scheme {
	case "https", "wss":
		return "443"
	}
	return "80"
}

// badPath reports a path whose meaning a server might read differently
// from a segment-wise comparison: dot segments (also percent-encoded,
// which Path has decoded), encoded slashes and backslashes.
func badPath(u *url.URL) bool {
	esc := strings.ToLower(u.EscapedPath())
	if strings.Contains(esc, "%2f") || strings.Contains(esc, "%5c") || strings.Contains(u.Path, `\`) {
		return true
	}
	for seg := range strings.SplitSeq(u.Path, "/") {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// Allowed are the operator's prefixes, as given.
func (p URLPolicy) Allowed() []string {
	out := make([]string, len(p.allow))
	for i, a := range p.allow {
		out[i] = a.raw
	}
	return out
}

// Checker is the Checker of source type typ (SourceWS, SourceHTTP).
func (p URLPolicy) Checker(typ string) Checker { return urlChecker{p: p, typ: typ} }

type urlChecker struct {
	p   URLPolicy
	typ string
}

func (c urlChecker) Check(agentID, value string) error {
	_, err := c.p.parse(agentID, c.typ, value)
	return err
}

// parse checks raw as a URL of source typ that agentID may open.
func (p URLPolicy) parse(agentID, typ, raw string) (*url.URL, error) {
	schemes := webSchemes[typ]
	want := schemes[0] + ":// or " + schemes[1] + "://"
	if len(raw) > MaxURLLen {
		return nil, subjects.Invalid(fmt.Sprintf("%s must be at most %d bytes", typ, MaxURLLen))
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL, which the agent has
		}
		return nil, subjects.Invalid(fmt.Sprintf("%s is not a valid URL: %v", typ, err))
	case !u.IsAbs() || u.Opaque != "" || u.Host == "":
		return nil, subjects.Invalid(fmt.Sprintf("%s must be an absolute %s URL", typ, want))
	case !slices.Contains(schemes, u.Scheme):
		return nil, subjects.Invalid(fmt.Sprintf("%s must be a %s URL, not %s://", typ, want, u.Scheme))
	case u.User != nil:
		return nil, subjects.Invalid(typ + " must carry no user or password (user:password@): chime sends no credentials an agent gives")
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return nil, subjects.Invalid(typ + " must have no #fragment")
	}
	return u, p.check(agentID, typ, u)
}

// check returns why agentID may not open u, or nil.
func (p URLPolicy) check(agentID, typ string, u *url.URL) error {
	if badPath(u) {
		return subjects.Invalid(typ + "'s path must have no . or .. segments, encoded slashes or backslashes")
	}
	if len(p.allow) == 0 {
		return urlNotAllowed("no URL is open to monitors here (CHIME_MONITOR_URLS is empty)")
	}
	host, port, path := strings.ToLower(u.Hostname()), portOf(u), u.Path
	if path == "" {
		path = "/"
	}
	for _, a := range p.allow {
		if a.scheme == u.Scheme && a.host == host && a.port == port && underPath(path, strings.ReplaceAll(a.path, AgentPlaceholder, agentID)) {
			return nil
		}
	}
	return urlNotAllowed(fmt.Sprintf("URL %s is not within the URLs open to monitors (CHIME_MONITOR_URLS: %s)", redacted(u), strings.Join(p.Allowed(), ", ")))
}

// underPath reports whether path lies under prefix on a segment boundary:
// /api holds /api and /api/x, not /apix; /api/ holds /api/x.
func underPath(path, prefix string) bool {
	switch {
	case prefix == "" || prefix == "/":
		return true
	case strings.HasSuffix(prefix, "/"):
		return strings.HasPrefix(path, prefix)
	}
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

func urlNotAllowed(msg string) *subjects.Error {
	return &subjects.Error{Code: CodeURLNotAllowed, Message: msg, Status: 403}
}

// redacted is u without its query and fragment: what a log or a message
// of chime's own says of a URL, whose query may hold a token.
func redacted(u *url.URL) string {
	c := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	return c.String()
}

// logged is what a log says of a source's value: a URL without its query.
func (s Source) logged() string {
	if s.Type != SourceWS && s.Type != SourceHTTP {
		return s.Value
	}
	u, err := url.Parse(s.Value)
	if err != nil {
		return "(unparsable URL)"
	}
	return redacted(u)
}

// client is the HTTP client of agentID's source of type typ: redirects
// are followed within the policy only, at most MaxRedirects; no cookie
// jar; connections are not kept (a poll every 30 s or more gains nothing
// from them, and a stopped monitor leaves nothing open).
func (p URLPolicy) client(agentID, typ string, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			DialContext:         (&net.Dialer{Timeout: WebTimeout}).DialContext,
			TLSHandshakeTimeout: WebTimeout,
			DisableKeepAlives:   true,
		},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) > MaxRedirects {
				return fmt.Errorf("stopped after %d redirects", MaxRedirects)
			}
			u := *req.URL
			if typ == SourceWS {
				// The handshake is HTTP: its redirects are checked as the
				// WebSocket URLs they lead to.
				u.Scheme = map[string]string{"http": "ws", "https": "wss"}[u.Scheme]
			}
			if err := p.check(agentID, typ, &u); err != nil {
				return fmt.Errorf("redirect to %s refused: %s", redacted(&u), wireMessage(err))
			}
			return nil
		},
	}
}

func wireMessage(err error) string {
	var wire *subjects.Error
	if errors.As(err, &wire) {
		return wire.Message
	}
	return err.Error()
}

// describeWebErr says why a request failed, without its URL (whose query may
// hold a token) and without what changes from one attempt to the next (a
// local port), so that the same failure reads the same each time.
func describeWebErr(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var dns *net.DNSError
	var op *net.OpError
	var ne net.Error
	switch {
	case errors.As(err, &dns):
		return fmt.Sprintf("cannot resolve %s: %s", dns.Name, dns.Err)
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, context.DeadlineExceeded):
		return "timed out"
	case errors.As(err, &op) && op.Err != nil:
		return op.Op + ": " + op.Err.Error()
	}
	return err.Error()
}

// webLines splits text into the lines of an event; empty lines carry
// nothing and are left out.
func webLines(text string) []string {
	var out []string
	for l := range strings.SplitSeq(text, "\n") {
		if strings.TrimRight(l, "\r") != "" {
			out = append(out, l)
		}
	}
	return out
}

// WSFeed watches a WebSocket: each text frame's lines are events; a
// binary frame is one line "binary frame of N bytes (not shown)". It
// keeps no cursor: what the server sends while no replica is connected (a
// takeover) is not seen, at most once. The server's closing the
// connection ends the monitor (source_ended, the close code as its exit
// code); a failed dial or a broken connection is retried with backoff
// until it has failed for RetryFor, which ends the monitor too.
type WSFeed struct {
	Policy URLPolicy
	// DialTimeout bounds a dial (default WebTimeout), RetryFor the
	// failures in a row (default WSRetryFor).
	DialTimeout, RetryFor time.Duration
	Log                   *slog.Logger
}

// Run watches m's WebSocket until ctx ends or the source ends.
func (f WSFeed) Run(ctx context.Context, m *Monitor, sink *Sink) error {
	u, err := f.Policy.parse(m.AgentID, SourceWS, m.Source.Value)
	if err != nil {
		// The operator narrowed CHIME_MONITOR_URLS since it started.
		return &SourceEnded{Why: "its URL is not open to monitors any more: " + wireMessage(err)}
	}
	dialFor, retryFor := orDefault(f.DialTimeout, WebTimeout), orDefault(f.RetryFor, WSRetryFor)
	log := f.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("agent_id", m.AgentID, "monitor_id", m.ID, "host", u.Host)
	client := f.Policy.client(m.AgentID, SourceWS, 0)
	retry := backoff.Policy{Min: 500 * time.Millisecond, Max: 10 * time.Second}
	var failing time.Time // when the failures in a row began
	for n := 0; ; n++ {
		up, frames, err := f.connect(ctx, u, client, dialFor, sink)
		if frames > 0 || (!up.IsZero() && time.Since(up) >= wsHealthy) {
			// It worked for a while: a new run of failures begins.
			failing, n = time.Time{}, 0
		}
		var closed websocket.CloseError
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.As(err, &closed):
			code := int(closed.Code)
			why := closed.Reason
			if why == "" {
				why = "no reason given"
			}
			return &SourceEnded{Code: &code, Why: fmt.Sprintf("the server closed the WebSocket (%d): %s", code, why)}
		}
		if failing.IsZero() {
			failing = time.Now()
		}
		if time.Since(failing) >= retryFor {
			return &SourceEnded{Why: fmt.Sprintf("the WebSocket failed for %s: %s", retryFor, describeWebErr(err))}
		}
		log.Debug("WebSocket monitor retries", "err", describeWebErr(err))
		if !retry.Sleep(ctx, n) {
			return nil
		}
	}
}

// wsHealthy is how long a connection must stay up, if it brings no frame,
// for its end to begin a new run of failures rather than continue one: a
// server that accepts and drops at once still ends the monitor.
const wsHealthy = 10 * time.Second

// connect dials u and reads its frames into sink until the connection
// ends: it returns when the dial succeeded (zero: it failed) and how many
// frames came.
func (f WSFeed) connect(ctx context.Context, u *url.URL, client *http.Client, dialFor time.Duration, sink *Sink) (up time.Time, frames int, err error) {
	dctx, cancel := context.WithTimeout(ctx, dialFor)
	c, _, err := websocket.Dial(dctx, u.String(), &websocket.DialOptions{
		HTTPClient: client, CompressionMode: websocket.CompressionDisabled,
		HTTPHeader: http.Header{"User-Agent": {"chime-monitor"}},
	})
	cancel()
	if err != nil {
		return time.Time{}, 0, fmt.Errorf("dial: %w", err)
	}
	up = time.Now()
	defer func() { _ = c.CloseNow() }()
	// Frames are cut to MaxWebBody here, the rest read and dropped,
	// rather than the connection failed over one large frame.
	c.SetReadLimit(-1)
	for ; ; frames++ {
		typ, r, err := c.Reader(ctx)
		if err != nil {
			return up, frames, err
		}
		buf, err := io.ReadAll(io.LimitReader(r, MaxWebBody))
		if err != nil {
			return up, frames, err
		}
		rest, err := io.Copy(io.Discard, r)
		if err != nil {
			return up, frames, err
		}
		if typ == websocket.MessageBinary {
			sink.Offer(Item{Line: fmt.Sprintf("binary frame of %d bytes (not shown)", int64(len(buf))+rest)})
			continue
		}
		// Offer, not Send: a reader that waited would only move the
		// backlog to the server; what the batches cannot take is counted
		// as suppressed.
		for _, l := range webLines(string(buf)) {
			sink.Offer(Item{Line: l})
		}
		if rest > 0 {
			sink.Offer(Item{Line: fmt.Sprintf("[frame cut at %d bytes: %d more not shown]", MaxWebBody, rest)})
		}
	}
}

// HTTPFeed polls a URL with GET every interval_ms (never faster than
// MinInterval): a poll whose result (status and body, or the failure)
// differs from the last one delivered delivers it; the first delivers the
// current state. Its cursor, "<unix ms of the last poll>:<hash of the
// last result delivered>", lets the next holder of a moved monitor
// neither deliver an unchanged result again nor poll before the interval
// has passed since the last poll.
type HTTPFeed struct {
	Policy URLPolicy
	// Store, when set, keeps each poll's time in the record as soon as
	// the poll is done (a poll that changed nothing sends no batch to
	// carry it), so that a takeover waits from it; without it, a takeover
	// may poll early (delivering nothing new).
	Store *Store
	// Timeout bounds a request (default WebTimeout).
	Timeout time.Duration
	// MinInterval is the shortest interval polled, whatever the record
	// says (default MinInterval, which a request may not go below).
	MinInterval time.Duration
	Log         *slog.Logger
}

// markWithin bounds the write of a poll's time, which goes on when the
// watch ends meanwhile: the poll was made, and the next holder must know.
const markWithin = 2 * time.Second

// Run polls m's URL until ctx ends.
func (f HTTPFeed) Run(ctx context.Context, m *Monitor, sink *Sink) error {
	u, err := f.Policy.parse(m.AgentID, SourceHTTP, m.Source.Value)
	if err != nil {
		return &SourceEnded{Why: "its URL is not open to monitors any more: " + wireMessage(err)}
	}
	every := time.Duration(m.IntervalMS) * time.Millisecond
	if every <= 0 {
		every = DefaultInterval
	}
	every = max(every, orDefault(f.MinInterval, MinInterval))
	log := f.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("agent_id", m.AgentID, "monitor_id", m.ID, "host", u.Host)
	client := f.Policy.client(m.AgentID, SourceHTTP, orDefault(f.Timeout, WebTimeout))
	last, seen, _ := parsePollCursor(m.Cursor)
	for {
		if !last.IsZero() && !backoff.Sleep(ctx, time.Until(last.Add(every))) {
			return nil
		}
		at := time.Now()
		res := pollOnce(ctx, client, u)
		if res.cut {
			return nil // cut short by the watch's end: not made
		}
		last = at
		if f.Store != nil {
			mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markWithin)
			if err := f.Store.markPolled(mctx, m.AgentID, m.ID, at); err != nil {
				log.Debug("poll time not kept", "err", err)
			}
			cancel()
		}
		if ctx.Err() != nil || res.hash == seen {
			continue
		}
		seen = res.hash
		// Only the poll's last line carries the cursor: a watch that ends
		// halfway through a poll's lines leaves the record at the result
		// before, and the next holder delivers this one whole (at least
		// once).
		cursor := pollCursor(at, res.hash)
		for i, l := range res.lines {
			it := Item{Line: l}
			if i == len(res.lines)-1 {
				it.Cursor = cursor
			}
			if err := sink.Send(ctx, it); err != nil {
				return nil
			}
		}
	}
}

// pollResult is what one poll found.
type pollResult struct {
	hash  string
	lines []string
	cut   bool // by ctx's end
}

// pollOnce GETs u once.
func pollOnce(ctx context.Context, client *http.Client, u *url.URL) pollResult {
	fail := func(why string) pollResult {
		return pollResult{hash: resultHash("error\n" + why), lines: []string{"error: " + why}}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return fail(err.Error())
	}
	req.Header.Set("User-Agent", "chime-monitor")
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return pollResult{cut: true}
		}
		return fail(describeWebErr(err))
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxWebBody+1))
	if err != nil {
		if ctx.Err() != nil {
			return pollResult{cut: true}
		}
		return fail("reading the body: " + describeWebErr(err))
	}
	cut := len(body) > MaxWebBody
	if cut {
		body = body[:MaxWebBody]
	}
	res := pollResult{hash: resultHash(strconv.Itoa(resp.StatusCode) + "\n" + string(body))}
	ok := resp.StatusCode >= 200 && resp.StatusCode < 300
	if !ok {
		res.lines = append(res.lines, fmt.Sprintf("HTTP %d", resp.StatusCode))
	}
	ls := webLines(string(body))
	if len(ls) > maxPollLines {
		ls = append(ls[:maxPollLines], fmt.Sprintf("[%d more lines not shown]", len(ls)-maxPollLines))
	}
	res.lines = append(res.lines, ls...)
	if cut {
		res.lines = append(res.lines, fmt.Sprintf("[body cut at %d bytes]", MaxWebBody))
	}
	if len(res.lines) == 0 {
		res.lines = []string{fmt.Sprintf("HTTP %d (empty body)", resp.StatusCode)}
	}
	return res
}

func resultHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}

func pollCursor(at time.Time, hash string) string { return fmt.Sprintf("%d:%s", at.UnixMilli(), hash) }

// parsePollCursor reads "<unix ms>:<hash>" (hash empty: nothing delivered
// yet).
func parsePollCursor(c string) (time.Time, string, bool) {
	ms, hash, ok := strings.Cut(c, ":")
	n, err := strconv.ParseInt(ms, 10, 64)
	if !ok || err != nil {
		return time.Time{}, "", false
	}
	return time.UnixMilli(n), hash, true
}

// markPolled keeps at, the time of a poll, in the record's cursor, with
// the hash of the last result delivered as the record has it: a poll that
// changed nothing sends no batch, and one whose batch a takeover cuts
// off is not delivered, yet the next holder must count the interval from
// it.
func (s *Store) markPolled(ctx context.Context, agentID, id string, at time.Time) error {
	_, _, err := s.update(ctx, agentID, id, func(m *Monitor) (bool, error) {
		was, seen, _ := parsePollCursor(m.Cursor)
		if m.Finished() || !at.After(was) {
			return false, nil
		}
		m.Cursor = pollCursor(at, seen)
		return true, nil
	}, nil, 0)
	return err
}
