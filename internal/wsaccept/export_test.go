package wsaccept

// Reading returns how many connections' first heads are being read.
func (l *Listener) Reading() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.reading)
}
