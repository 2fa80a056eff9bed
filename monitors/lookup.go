package monitors

import "context"

// Finished reports whether the agent's monitor id has stopped, and why:
// the one question WaitFor asks of a monitor (waitfor.MonitorLookup, which
// names no type of this package, so that waitfor, which agents' clients
// link, does not link the server's subject functions this package uses).
// An unknown monitor is MonitorNotFound.
func (s *Store) Finished(ctx context.Context, agentID, id string) (bool, string, error) {
	m, err := s.Get(ctx, agentID, id)
	if err != nil {
		return false, "", err
	}
	return m.Finished(), m.StopReason, nil
}
