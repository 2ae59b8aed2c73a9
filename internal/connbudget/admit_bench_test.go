package connbudget

import (
	"io"
	"net"
	"testing"
	"time"
)

// behindListener returns a listener at its caps (cfg, with Max or
// Pending n) holding n pending loopback connections whose clients sent a
// request the node has not read yet, though it waited on each for an
// hour: a storm the node is behind on, the readable check's worst case.
func behindListener(tb testing.TB, n int, cfg Config) *Listener {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	bl := New(ln, cfg)
	tb.Cleanup(func() { bl.Close() })
	for range n {
		cl, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { cl.Close() })
		nc, err := bl.Accept()
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { nc.Close() })
		io.WriteString(cl, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		c := nc.(*Conn)
		deadline := time.Now().Add(waitTimeout)
		for !readable(c.Conn) {
			if time.Now().After(deadline) {
				tb.Fatal("the request is not in")
			}
			time.Sleep(time.Millisecond)
		}
		c.readSince.Store(mono() - int64(time.Hour)) // a read parked for an hour
	}
	return bl
}

// BenchmarkAdmitAtCap is an accept at a cap while 256 pending connections
// hold the node, none stalled (their requests wait unread): at the node's
// cap the newcomer is refused, at the pending cap admitted (and closed
// again).
func BenchmarkAdmitAtCap(b *testing.B) {
	const n = 256
	newcomer := fakeConn{addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1)}}
	b.Run("max", func(b *testing.B) {
		bl := behindListener(b, n, Config{Max: n})
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if _, _, r := bl.admit(newcomer); r == nil {
				b.Fatal("admitted beyond the cap")
			}
		}
	})
	b.Run("pending", func(b *testing.B) {
		bl := behindListener(b, n, Config{Pending: n})
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			c, victims, r := bl.admit(newcomer)
			if r != nil || len(victims) != 0 {
				b.Fatal("refused, or a connection evicted")
			}
			bl.mu.Lock()
			bl.releaseLocked(c)
			bl.mu.Unlock()
		}
	})
}
