package api

import (
	"net/http"
)

// ownWrite reports the one write route an agent may call for itself:
// acking its inbox.
func ownWrite(r *http.Request, agentID string) bool {
	return r.Method == http.MethodPost && r.URL.Path == "/api/agents/"+agentID+"/inbox/ack"
}
