package natsbus

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
)

// mirrorLog records what a bus's Mirror is handed.
type mirrorLog struct {
	mu     sync.Mutex
	events []presence.Event
	block  chan struct{} // if not nil, Mirror waits on it
}

func (m *mirrorLog) mirror(ev *presence.Event) {
	if m.block != nil {
		<-m.block
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.events = append(m.events, *ev)
}

func (m *mirrorLog) of(user string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, ev := range m.events {
		if ev.UserID == user {
			n++
		}
	}
	return n
}

// A bus with a Mirror is handed every change of the other nodes, of users
// nobody on it watches too, never its own; watchers are served as before.
func TestMirrorGetsEveryChange(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	var am, bm mirrorLog
	a := e.open("a", func(c *Config) { c.Mirror = am.mirror })
	b := e.open("b", func(c *Config) { c.Mirror = bm.mirror })
	b.watch("w")
	a.Publish(event("u1", 1))
	a.Publish(event("w", 1))
	a.Publish(event("u2", 7))
	testwait.For(t, "b's mirror to get u2", func() bool { return bm.of("u2") == 1 })
	if bm.of("u1") != 1 || bm.of("w") != 1 {
		t.Errorf("b's mirror got u1 %d, w %d times, want once each", bm.of("u1"), bm.of("w"))
	}
	testwait.For(t, "b's watcher to get w", func() bool { return len(b.rec.of("w")) == 1 })
	if len(b.rec.of("u1")) != 0 {
		t.Error("b's watchers got u1, which nobody on b watches")
	}
	b.Publish(event("marker", 1))
	testwait.For(t, "a's mirror to get b's marker", func() bool { return am.of("marker") == 1 })
	if n := am.of("u1") + am.of("u2") + am.of("w"); n != 0 {
		t.Errorf("a's mirror got %d of its own changes back", n)
	}
	if st := b.Stats(); st.Mirrored != 3 {
		t.Errorf("b mirrored %d changes, want 3", st.Mirrored)
	}
}

// When the mirror falls behind and nats.go drops its messages, the bus
// says so with OnMirrorLost — not OnReconnect: the watchers lost nothing.
func TestMirrorLostWhenBehind(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	bm := mirrorLog{block: make(chan struct{})}
	var lost, reconnects atomic.Int32
	a := e.open("a")
	b := e.open("b", func(c *Config) {
		c.Mirror = bm.mirror
		c.OnMirrorLost = func() { lost.Add(1) }
		c.OnReconnect = func() { reconnects.Add(1) }
	})
	for i := range incomingBuffer + 2000 {
		a.Publish(event("u", uint64(i+1)))
	}
	testwait.For(t, "OnMirrorLost", func() bool { return lost.Load() > 0 })
	close(bm.block)
	if reconnects.Load() != 0 {
		t.Errorf("OnReconnect called %d times for the mirror's drops", reconnects.Load())
	}
	if b.Stats().SlowConsumer == 0 {
		t.Error("the mirror's drops were not counted")
	}
}
