package gateway

import "github.com/presenced/presenced/internal/admission"

// Detached counts the open connections whose socket the gateway took from
// its net.Conn (detach) and all open connections.
func Detached(g *Gateway) (detached, open int) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	for _, c := range g.conns {
		if c.hasFD {
			detached++
		}
		open++
	}
	return detached, open
}

// Writing counts the open connections with a writer running.
func Writing(g *Gateway) int {
	g.mu.RLock()
	defer g.mu.RUnlock()
	n := 0
	for _, c := range g.conns {
		c.mu.Lock()
		if c.flushing {
			n++
		}
		c.mu.Unlock()
	}
	return n
}

// SetupGate is the gate of g's handshakes and subscribes (Config.Setup).
func SetupGate(g *Gateway) *admission.Gate { return g.setup }
