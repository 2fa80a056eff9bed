package mcp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// Stdio serves an agent's MCP server on a process's standard streams, for
// clients that launch servers as processes: each JSON-RPC message read
// from in (one a line) is posted to the agent's HTTP endpoint with the
// token, and each answer written to out, one a line. The HTTP server does
// the protocol, so the two transports cannot differ; this only carries
// messages, with the headers Streamable HTTP asks of a client (the
// negotiated version, Mcp-Method, Mcp-Name). Requests run side by side (a
// blocking wait does not hold up the rest), at most stdioInFlight at once.
type Stdio struct {
	Endpoint string // http(s)://host:port/api/agents/<id>/mcp
	Token    string
	Client   *http.Client // nil: http.DefaultClient
	Log      *slog.Logger

	mu      sync.Mutex // guards out and version
	out     io.Writer
	version string // negotiated by initialize, for later requests' header
}

const (
	stdioInFlight = 16
	// stdioMaxLine bounds one message read from in: above the largest
	// request body chime takes.
	stdioMaxLine = 4 << 20
)

// message is a JSON-RPC message as the proxy reads it.
type message struct {
	ID     json.RawMessage `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
}

// Run carries messages until in ends or ctx does.
func (s *Stdio) Run(ctx context.Context, in io.Reader, out io.Writer) error {
	s.out = out
	if s.Client == nil {
		s.Client = http.DefaultClient
	}
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), stdioMaxLine)
	sem := make(chan struct{}, stdioInFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var m message
		if err := json.Unmarshal(line, &m); err != nil {
			s.reply(nil, &jsonrpc.Error{Code: jsonrpc.CodeParseError, Message: "chime mcp: " + err.Error()})
			continue
		}
		if m.Method == "" {
			// A response to a server's request: the stateless server sends
			// none, so there is nothing to carry it to.
			continue
		}
		body := bytes.Clone(line)
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		wg.Go(func() {
			defer func() { <-sem }()
			s.forward(ctx, m, body)
		})
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("mcp: stdin: %w", err)
	}
	return nil
}

// forward posts one message and writes its answers.
func (s *Stdio) forward(ctx context.Context, m message, body []byte) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.Endpoint, bytes.NewReader(body))
	if err != nil {
		s.reply(m.ID, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "chime mcp: " + err.Error()})
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if s.Token != "" {
		req.Header.Set("Authorization", "Bearer "+s.Token)
	}
	req.Header.Set("Mcp-Method", m.Method)
	if name := headerName(m); name != "" {
		req.Header.Set("Mcp-Name", name)
	}
	if v := s.versionFor(m); v != "" {
		req.Header.Set("Mcp-Protocol-Version", v)
	}
	resp, err := s.Client.Do(req)
	if err != nil {
		s.reply(m.ID, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "chime mcp: " + err.Error()})
		return
	}
	defer resp.Body.Close()
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch {
	case resp.StatusCode == http.StatusAccepted:
		// A notification, taken.
	case ct == "text/event-stream":
		s.events(m, resp.Body)
	case ct == "application/json":
		b, err := io.ReadAll(io.LimitReader(resp.Body, stdioMaxLine))
		if err != nil {
			s.reply(m.ID, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "chime mcp: " + err.Error()})
			return
		}
		if !s.answer(m, b) {
			// Not JSON-RPC: chime's own error (a token refused, a route
			// not found), as a JSON-RPC error.
			s.reply(m.ID, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("chime: %s: %s", resp.Status, bytes.TrimSpace(b))})
		}
	default:
		s.reply(m.ID, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "chime: " + resp.Status})
	}
}

// events writes each message of an SSE answer.
func (s *Stdio) events(m message, body io.Reader) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), stdioMaxLine)
	var data []byte
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimSpace(strings.TrimPrefix(line, "data:"))...)
		case line == "" && len(data) > 0:
			s.answer(m, data)
			data = nil
		}
	}
	if len(data) > 0 {
		s.answer(m, data)
	}
}

// answer writes a JSON-RPC answer to m, and keeps the version an
// initialize negotiated; false when b is no JSON-RPC message.
func (s *Stdio) answer(m message, b []byte) bool {
	var r struct {
		JSONRPC string `json:"jsonrpc"`
		Result  struct {
			ProtocolVersion string `json:"protocolVersion"`
		} `json:"result"`
	}
	if json.Unmarshal(b, &r) != nil || r.JSONRPC != "2.0" {
		return false
	}
	var line bytes.Buffer
	if json.Compact(&line, b) != nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if m.Method == "initialize" && r.Result.ProtocolVersion != "" {
		s.version = r.Result.ProtocolVersion
	}
	line.WriteByte('\n')
	if _, err := s.out.Write(line.Bytes()); err != nil {
		s.Log.Warn("chime mcp: writing an answer", "err", err)
	}
	return true
}

// reply writes a JSON-RPC error for a request (none for a notification).
func (s *Stdio) reply(id json.RawMessage, e *jsonrpc.Error) {
	if len(id) == 0 {
		s.Log.Warn("chime mcp", "err", e.Message)
		return
	}
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   *jsonrpc.Error  `json:"error"`
	}{"2.0", id, e})
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = s.out.Write(append(b, '\n'))
}

// versionFor is the protocol version header of m: the one its _meta names
// (a 2026-07-28 request), else the one initialize negotiated.
func (s *Stdio) versionFor(m message) string {
	var p struct {
		Meta map[string]any `json:"_meta"`
	}
	if json.Unmarshal(m.Params, &p) == nil {
		if v, ok := p.Meta["io.modelcontextprotocol/protocolVersion"].(string); ok {
			return v
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version
}

// headerName is m's Mcp-Name header: the tool, prompt, resource or task
// it names.
func headerName(m message) string {
	var p struct {
		Name   string `json:"name"`
		URI    string `json:"uri"`
		TaskID string `json:"taskId"`
	}
	if json.Unmarshal(m.Params, &p) != nil {
		return ""
	}
	switch {
	case m.Method == "tools/call" || m.Method == "prompts/get":
		return p.Name
	case m.Method == "resources/read":
		return p.URI
	case strings.HasPrefix(m.Method, "tasks/"):
		return p.TaskID
	}
	return ""
}
