package natsbus

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	// w, watched on b, comes to the mirror from its own subscription
	// (before the watchers) and from the whole tree's.
	testwait.For(t, "b's mirror to get w twice", func() bool { return bm.of("w") == 2 })
	if bm.of("u1") != 1 {
		t.Errorf("b's mirror got u1 %d times, want once", bm.of("u1"))
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
	// MirrorSync says ErrMirrorBehind while there are drops OnMirrorLost
	// was not called for (nats.go reports one an episode), and calls it;
	// once it returns nil, every drop was reported.
	testwait.For(t, "MirrorSync to succeed", func() bool {
		err := b.MirrorSync(context.Background())
		if err != nil && !errors.Is(err, ErrMirrorBehind) {
			t.Fatal(err)
		}
		return err == nil
	})
	dropped, _ := b.allSub.Dropped()
	b.syncMu.Lock()
	seen := b.droppedSeen
	b.syncMu.Unlock()
	if dropped == 0 || seen != dropped {
		t.Errorf("MirrorSync succeeded with %d drops of which %d reported", dropped, seen)
	}
}

// mirrorFirst is a Local that records whether the mirror had each change
// it is handed.
type mirrorFirst struct {
	*recorder
	m      *mirrorLog
	missed atomic.Int32
}

func (l *mirrorFirst) Publish(ev *presence.Event) {
	if l.m.of(ev.UserID) == 0 {
		l.missed.Add(1)
	}
	l.recorder.Publish(ev)
}

// A change of a watched user reaches the mirror before the watchers: a
// watcher registered after the watchers were handed it finds it in the
// mirror.
func TestMirrorBeforeWatchers(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	var bm mirrorLog
	a := e.open("a")
	var l *mirrorFirst
	b := e.open("b", func(c *Config) {
		c.Mirror = bm.mirror
		l = &mirrorFirst{recorder: c.Local.(*recorder), m: &bm}
		c.Local = l
	})
	b.watch("w1", "w2", "w3")
	for _, u := range []string{"w1", "w2", "w3"} {
		a.Publish(event(u, 1))
	}
	testwait.For(t, "b's watchers to get w3", func() bool { return len(b.rec.of("w3")) == 1 })
	if n := l.missed.Load(); n != 0 {
		t.Errorf("%d changes reached the watchers before the mirror", n)
	}
}

// MirrorSync returns only once the mirror was handed every change NATS
// delivered before it, however far behind the mirror is.
func TestMirrorSync(t *testing.T) {
	e := newEnv(t, testsvc.SharedNATS(t))
	bm := mirrorLog{block: make(chan struct{})}
	a := e.open("a")
	b := e.open("b", func(c *Config) { c.Mirror = bm.mirror })
	const n = 200
	for i := range n {
		a.Publish(event("u"+string(rune('a'+i%26)), uint64(i+1)))
	}
	testwait.For(t, "the stream to take a's changes", func() bool { return a.Stats().Acked == n })
	synced := make(chan error, 1)
	go func() { synced <- b.MirrorSync(context.Background()) }()
	select {
	case err := <-synced:
		t.Fatalf("MirrorSync returned (%v) while the mirror held none of %d changes", err, n)
	case <-time.After(200 * time.Millisecond):
	}
	close(bm.block)
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	bm.mu.Lock()
	got := len(bm.events)
	bm.mu.Unlock()
	if got != n {
		t.Errorf("the mirror had %d of the %d changes when MirrorSync returned", got, n)
	}

	// A caller that gives up is told why.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.MirrorSync(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("MirrorSync with its context done: %v", err)
	}
	if err := b.MirrorSync(context.Background()); err != nil {
		t.Errorf("MirrorSync after one gave up: %v", err)
	}
	if err := a.MirrorSync(context.Background()); !errors.Is(err, ErrMirrorBehind) {
		t.Errorf("MirrorSync of a bus with no mirror: %v, want ErrMirrorBehind", err)
	}
}

// A user's subscription is settled once it is settleTime old; never
// while the user is not watched.
func TestSettled(t *testing.T) {
	old := settleTime
	settleTime = 300 * time.Millisecond
	t.Cleanup(func() { settleTime = old })
	e := newEnv(t, testsvc.SharedNATS(t))
	b := e.open("b")
	b.watch("w")
	got := make([]bool, 2)
	b.Settled([]string{"w", "nobody"}, got)
	if got[0] || got[1] {
		t.Fatalf("settled at once: %v", got)
	}
	time.Sleep(settleTime)
	b.Settled([]string{"w", "nobody"}, got)
	if !got[0] || got[1] {
		t.Fatalf("after settleTime: %v, want w only", got)
	}
	b.unwatch("w")
	b.watch("w") // subscribed again: a new subscription
	b.Settled([]string{"w"}, got[:1])
	if got[0] {
		t.Error("a subscription made again is settled at once")
	}
}
