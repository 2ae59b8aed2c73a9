package gateway

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/wsframe"
)

type nopTracker struct{}

func (nopTracker) SocketBeat(context.Context, string, string, bool) (presence.Change, error) {
	return presence.Change{}, nil
}

func (nopTracker) SocketConnect(context.Context, string, string) (presence.Change, error) {
	return presence.Change{}, nil
}
func (nopTracker) SetStatus(context.Context, string, presence.Manual, string) (presence.Change, error) {
	return presence.Change{}, nil
}
func (nopTracker) Disconnect(context.Context, string, string, int64) error { return nil }
func (nopTracker) Bye(context.Context, string, string) (presence.Change, error) {
	return presence.Change{}, nil
}

type nopReader struct{}

func (nopReader) Read(context.Context, string, []string, []privacy.View) error { return nil }

// pipeConn returns a registered connection whose socket is one end of a
// pipe, and the other end to read what it writes.
func pipeConn(t *testing.T, queueLen int) (*Gateway, *conn, *bufio.Reader) {
	t.Helper()
	g, err := New(Config{Tracker: nopTracker{}, Reader: nopReader{}, Auth: auth.New(auth.Config{Dev: true}),
		QueueLen: queueLen, NoEpoll: true, WriteTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	g.running = true
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close(); g.shutdown() })
	c := &conn{g: g, nc: a, user: "1", device: "d", id: 1}
	if _, ok := g.register(c); !ok {
		t.Fatal("register")
	}
	return g, c, bufio.NewReader(b)
}

func readFrame(t *testing.T, r *bufio.Reader) ws.Frame {
	t.Helper()
	f, err := wsframe.Read(r)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestCoalesce: while a write is in flight, a newer frame of a user
// replaces the queued one and an older one is dropped.
func TestCoalesce(t *testing.T) {
	_, c, r := pipeConn(t, 8)
	c.Deliver("x", 1, []byte("x1")) // taken by the writer, blocked on the pipe
	waitQueue(t, c, 0)
	c.Deliver("y", 1, []byte("y1"))
	c.Deliver("x", 3, []byte("x3"))
	c.Deliver("x", 2, []byte("x2"))
	c.Deliver("y", 2, []byte("y2"))
	var got []string
	for range 3 {
		got = append(got, string(readFrame(t, r).Payload))
	}
	if fmt.Sprint(got) != "[x1 y2 x3]" {
		t.Fatalf("frames %v, want [x1 y2 x3]", got)
	}
}

func waitQueue(t *testing.T, c *conn, n int) {
	t.Helper()
	l := func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.queue)
	}
	testwait.Forf(t, func() string { return fmt.Sprintf("queue length %d, want %d", l(), n) }, func() bool { return l() == n })
}

// TestQueueOverflow: a connection whose queue of distinct users fills up
// is closed 4002 without the queued frames, and Deliver never blocks.
func TestQueueOverflow(t *testing.T) {
	g, c, r := pipeConn(t, 4)
	c.Deliver("u0", 1, []byte("first"))
	waitQueue(t, c, 0)
	done := make(chan struct{})
	go func() {
		for i := 1; i <= 100; i++ {
			c.Deliver(fmt.Sprint("u", i), 1, []byte("x"))
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Deliver blocked")
	}
	if n := g.stats.closedSlow.Load(); n != 1 {
		t.Fatalf("closedSlow %d", n)
	}
	if f := readFrame(t, r); string(f.Payload) != "first" {
		t.Fatalf("first frame %q", f.Payload)
	}
	f := readFrame(t, r)
	if code, _ := ws.ParseCloseFrameData(f.Payload); f.Header.OpCode != ws.OpClose || code != closeSlow {
		t.Fatalf("frame %v %q, want close 4002", f.Header.OpCode, f.Payload)
	}
}

// TestFeedSplits: frames split at every byte boundary and several frames in
// one read decode the same.
func TestFeedSplits(t *testing.T) {
	var stream []byte
	msgs := []string{`{"type":"dance"}`, `{"type":"x"}`}
	for _, m := range msgs {
		f := ws.MaskFrameInPlace(ws.NewTextFrame([]byte(m)))
		b, err := ws.CompileFrame(f)
		if err != nil {
			t.Fatal(err)
		}
		stream = append(stream, b...)
	}
	for cut := 1; cut < len(stream); cut++ {
		_, c, r := pipeConn(t, 8)
		in := append([]byte(nil), stream...)
		got := make(chan int, 1)
		go func() {
			n := 0
			for range msgs {
				f, err := wsframe.Read(r)
				if err != nil {
					break
				}
				if f.Header.OpCode == ws.OpText {
					n++
				}
			}
			got <- n
		}()
		if !c.feed(in[:cut]) || !c.feed(in[cut:]) {
			t.Fatalf("cut %d: closed", cut)
		}
		if n := <-got; n != len(msgs) {
			t.Fatalf("cut %d: %d answers", cut, n)
		}
	}
}

// TestCoalesceLongQueue: the same with a backlog long enough to be indexed.
func TestCoalesceLongQueue(t *testing.T) {
	_, c, r := pipeConn(t, 200)
	c.Deliver("first", 1, []byte("first"))
	waitQueue(t, c, 0)
	for i := range 100 {
		c.Deliver(fmt.Sprint("u", i), 2, []byte(fmt.Sprint("u", i, "v2")))
	}
	for i := range 100 {
		v := uint64(3)
		if i%2 == 1 {
			v = 1 // stale: dropped
		}
		c.Deliver(fmt.Sprint("u", i), v, []byte(fmt.Sprint("u", i, "v", v)))
	}
	if got := string(readFrame(t, r).Payload); got != "first" {
		t.Fatalf("got %q", got)
	}
	for i := range 100 {
		want := fmt.Sprint("u", i, "v3")
		if i%2 == 1 {
			want = fmt.Sprint("u", i, "v2")
		}
		if got := string(readFrame(t, r).Payload); got != want {
			t.Fatalf("frame %d: %q, want %q", i, got, want)
		}
	}
}

// TestIdleIndex: a silent connection comes due after one ttl, one that
// spoke is pushed back, and a closed one leaves the index at once.
func TestIdleIndex(t *testing.T) {
	g, c, _ := pipeConn(t, 8)
	c.heapIdx = -1
	c.idleAt.Store(1000)
	g.idle.push(1000, c)
	a, b := net.Pipe()
	defer b.Close()
	c2 := &conn{g: g, nc: a, user: "2", device: "d", id: 2, heapIdx: -1}
	if _, ok := g.register(c2); !ok {
		t.Fatal("register")
	}
	c2.idleAt.Store(1000)
	g.idle.push(1000, c2)
	c2.idleAt.Store(5000) // spoke

	if due := g.idle.due(999, nil); len(due) != 0 {
		t.Fatalf("due early: %d", len(due))
	}
	due := g.idle.due(1000, nil)
	if len(due) != 1 || due[0] != c {
		t.Fatalf("due %v", due)
	}
	if len(g.idle.h) != 1 || g.idle.h[0].at != 5000 {
		t.Fatalf("heap %+v, want c2 at 5000", g.idle.h)
	}
	c2.teardown()
	if len(g.idle.h) != 0 {
		t.Fatalf("heap %+v after teardown, want empty", g.idle.h)
	}
}

// TestIdleIndexTokenExpiry: a connection's item sits at the earlier of its
// idle deadline and its token's expiry; speaking moves the first, never the
// second, and a connection without a token has no expiry.
func TestIdleIndexTokenExpiry(t *testing.T) {
	g, _, _ := pipeConn(t, 8)
	mk := func(id uint64, idleAt, expAt int64) *conn {
		c := &conn{g: g, user: fmt.Sprint(id), device: "d", id: id, heapIdx: -1, expAt: expAt}
		c.idleAt.Store(idleAt)
		g.idle.push(c.deadline(), c)
		return c
	}
	soon := mk(10, 5000, 3000)     // expires before it would be idle
	spoke := mk(11, 1000, 4000)    // idle first, then speaks
	dev := mk(12, 1000, 0)         // no token, then speaks
	later := mk(13, 2000, 100_000) // idle long before it expires
	spoke.idleAt.Store(9000)
	dev.idleAt.Store(9000)

	if due := g.idle.due(1999, nil); len(due) != 0 {
		t.Fatalf("due at 1999: %d connections, want none (the two that spoke are pushed back)", len(due))
	}
	if due := g.idle.due(2000, nil); len(due) != 1 || due[0] != later {
		t.Fatalf("due at 2000: %v, want the silent one", due)
	}
	if due := g.idle.due(3000, nil); len(due) != 1 || due[0] != soon || !soon.expired(3000) || soon.expired(2999) {
		t.Fatalf("due at 3000: %v, want the one whose token expires", due)
	}
	if due := g.idle.due(4000, nil); len(due) != 1 || due[0] != spoke || !spoke.expired(4000) {
		t.Fatalf("due at 4000: %v, want the one that spoke but whose token expires", due)
	}
	if due := g.idle.due(8999, nil); len(due) != 0 {
		t.Fatalf("due at 8999: %d connections, want none", len(due))
	}
	if due := g.idle.due(9000, nil); len(due) != 1 || due[0] != dev || dev.expired(1<<60) {
		t.Fatalf("due at 9000: %v, want the tokenless one, idle and never expired", due)
	}
}
