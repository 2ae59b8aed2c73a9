package gateway

// WritersWaiting counts the writers waiting for room in their socket's
// send buffer (EPOLLOUT).
func WritersWaiting(g *Gateway) int {
	g.mu.RLock()
	p, ok := g.poll.(*epoller)
	g.mu.RUnlock()
	if !ok {
		return 0
	}
	p.wmu.Lock()
	defer p.wmu.Unlock()
	return len(p.waiters)
}
