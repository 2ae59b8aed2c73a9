package connbudget

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/testwait"
)

// behindListener returns a listener at its caps (cfg, with Max or
// Pending n) holding n pending loopback connections, oldest first, whose
// clients sent a request the node has not read yet, though it waited on
// each for an hour: a storm the node is behind on, the readable check's
// worst case.
func behindListener(tb testing.TB, n int, cfg Config) (*Listener, []*Conn) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	bl := New(ln, cfg)
	tb.Cleanup(func() { bl.Close() })
	var conns []*Conn
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
		testwait.For(tb, "the request to be in", func() bool { return readable(c.Conn) })
		c.readSince.Store(mono() - int64(time.Hour)) // a read parked for an hour
		conns = append(conns, c)
	}
	return bl, conns
}

// checks returns the readable checks bl made.
func checks(bl *Listener) uint64 {
	bl.mu.Lock()
	defer bl.mu.Unlock()
	return bl.probes
}

// BenchmarkAdmitAtCap is an accept at a cap while 256 pending connections
// hold the node, none stalled (their requests wait unread): at the node's
// cap the newcomer is refused, at the pending cap admitted (and closed
// again). In "reads", a read of each connection began since the accept
// before (what the node found unread may be read now): the worst case.
func BenchmarkAdmitAtCap(b *testing.B) {
	const n = 256
	newcomer := fakeConn{addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1)}}
	for _, tc := range []struct {
		name  string
		cfg   Config
		reads bool
	}{
		{"max", Config{Max: n}, false},
		{"max/reads", Config{Max: n}, true},
		{"pending", Config{Pending: n}, false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			bl, conns := behindListener(b, n, tc.cfg)
			before := checks(bl)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if tc.reads {
					for _, c := range conns[:scanLimit] {
						c.reads.Add(1)
					}
				}
				c, victims, r := bl.admit(newcomer)
				switch {
				case len(victims) != 0:
					b.Fatal("a connection evicted")
				case tc.cfg.Max > 0 && r == nil:
					b.Fatal("admitted beyond the cap")
				case tc.cfg.Max > 0:
				case r != nil:
					b.Fatal("refused at the pending cap")
				default:
					bl.mu.Lock()
					bl.releaseLocked(c)
					bl.mu.Unlock()
				}
			}
			b.ReportMetric(float64(checks(bl)-before)/float64(b.N), "checks/op")
		})
	}
}
