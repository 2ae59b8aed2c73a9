//go:build linux

package gateway

import (
	"net"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/testwait"
)

// serverSide returns the accepted end of a loopback TCP connection and the
// client's end.
func serverSide(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cl, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	sv, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sv.Close() })
	return sv, cl
}

// A connection whose bytes wait unread because the server's workers are
// behind is not idle: the sweep gives it another ttl instead of closing it.
func TestSweepIdleSparesUnreadBytes(t *testing.T) {
	sv, client := serverSide(t)
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	g := &Gateway{clock: clk, ttlMs: 10_000}
	c := &conn{g: g, fd: -1, heapIdx: -1}
	c.detach(sv)
	if !c.hasFD {
		t.Fatal("the socket was not detached")
	}
	t.Cleanup(c.sockClose)
	c.idleAt.Store(g.now() + g.ttlMs)
	g.idle.push(g.now()+g.ttlMs, c)
	if unread(c) {
		t.Fatal("unread bytes before the client wrote any")
	}
	if _, err := client.Write([]byte{0x81, 0x80}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the written bytes to show as unread", func() bool { return unread(c) })
	clk.Advance(11 * time.Second)
	g.sweepIdle()
	if n := g.stats.closedIdle.Load(); n != 0 {
		t.Fatalf("closed %d connections as idle although they had spoken", n)
	}
	if at := c.idleAt.Load(); at != g.now()+g.ttlMs || c.heapIdx < 0 {
		t.Fatalf("idleAt %d (heap index %d), want %d and back in the index", at, c.heapIdx, g.now()+g.ttlMs)
	}
}
