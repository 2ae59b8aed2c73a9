// Package loglimit keeps a repeating failure from flooding the log: one line
// per kind a second, and the count of those held back on the next.
package loglimit

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Limiter lets one log line per kind through per second and counts the
// ones it held back. The zero value is ready; it is safe for concurrent use.
type Limiter struct {
	mu   sync.Mutex // guards the fields below
	last map[string]time.Time
	held map[string]int
}

// Log logs msg at level unless a line of the same kind went out less than
// a second ago; the next line that goes out says how many were held back.
func (l *Limiter) Log(log *slog.Logger, level slog.Level, kind, msg string, args ...any) {
	now := time.Now()
	l.mu.Lock()
	if l.last == nil {
		l.last, l.held = map[string]time.Time{}, map[string]int{}
	}
	if now.Sub(l.last[kind]) < time.Second {
		l.held[kind]++
		l.mu.Unlock()
		return
	}
	held := l.held[kind]
	l.last[kind], l.held[kind] = now, 0
	if len(l.last) > 1024 {
		// Kinds are a handful of fixed strings (and a library's messages):
		// never let them grow without bound.
		clear(l.last)
		clear(l.held)
	}
	l.mu.Unlock()
	if held > 0 {
		args = append(args, "suppressed", held)
	}
	log.Log(context.Background(), level, msg, args...)
}

// Warn is Log at warning level.
func (l *Limiter) Warn(log *slog.Logger, kind, msg string, args ...any) {
	l.Log(log, slog.LevelWarn, kind, msg, args...)
}
