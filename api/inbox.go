package api

import (
	"net/http"
)

// ownWrite reports the write routes an agent may call for itself outside
// /api/control: acking its inbox, and its MCP server (whose tools are the
// agent's own actions, each checked as any other call of them).
func ownWrite(r *http.Request, agentID string) bool {
	own := "/api/agents/" + agentID
	return r.Method == http.MethodPost && (r.URL.Path == own+"/inbox/ack" || r.URL.Path == own+"/mcp")
}
