package gateway

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/presenced/presenced/internal/auth"
)

// FuzzFeed drives the frame reader with arbitrary bytes from a client, cut
// in two reads at an arbitrary point: it never panics, never keeps more
// than one message and a header of unread input, and a connection it gives
// up on is closing.
func FuzzFeed(f *testing.F) {
	mask := [4]byte{1, 2, 3, 4}
	frame := func(op ws.OpCode, fin bool, p string) []byte {
		b := []byte(p)
		ws.Cipher(b, mask, 0)
		h := ws.Header{Fin: fin, OpCode: op, Masked: true, Mask: mask, Length: int64(len(b))}
		out := make([]byte, 0, 14+len(b))
		w := &appendWriter{&out}
		_ = ws.WriteHeader(w, h)
		return append(out, b...)
	}
	cat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	for _, seed := range [][]byte{
		frame(ws.OpText, true, `{"type":"heartbeat"}`),
		cat(frame(ws.OpText, false, `{"type":"set_st`), frame(ws.OpContinuation, true, `atus","status":"busy"}`)),
		cat(frame(ws.OpText, false, `{`), frame(ws.OpPing, true, "p"), frame(ws.OpContinuation, true, `"type":"bye"}`)),
		frame(ws.OpClose, true, "\x03\xe8bye"),
		frame(ws.OpBinary, true, "\x00\x01"),
		frame(ws.OpContinuation, true, "orphan"),
		{0x81, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, // a 2^63 length
		{0x81, 0x05, 'h', 'e', 'l', 'l', 'o'},                        // unmasked
		{0xf1, 0x80, 0, 0, 0, 0},                                     // reserved bits
	} {
		f.Add(seed, uint16(len(seed)/2))
	}
	f.Fuzz(func(t *testing.T, data []byte, cut uint16) {
		g, err := New(Config{Tracker: nopTracker{}, Reader: nopReader{}, Auth: auth.New(auth.Config{Dev: true}),
			NoEpoll: true, WriteTimeout: time.Second, MaxMessage: 4096})
		if err != nil {
			t.Fatal(err)
		}
		g.running = true
		a, b := net.Pipe()
		go io.Copy(io.Discard, b) // the client reads whatever the server writes
		defer func() { a.Close(); b.Close(); g.shutdown() }()
		c := &conn{g: g, nc: a, user: "1", device: "d", id: 1, heapIdx: -1}
		if _, ok := g.register(c); !ok {
			t.Fatal("register")
		}
		i := min(int(cut), len(data))
		for _, part := range [][]byte{data[:i], data[i:]} {
			// feed may keep its input: give it a copy, as a read buffer is reused.
			if !c.feed(append([]byte(nil), part...)) {
				c.mu.Lock()
				closing := c.closing
				c.mu.Unlock()
				if !closing {
					t.Fatal("feed gave up on a connection that is not closing")
				}
				return
			}
			if c.part == nil {
				continue
			}
			if len(c.part.in) > g.cfg.MaxMessage+14 {
				t.Fatalf("%d bytes of input kept, more than a message (%d) and a header", len(c.part.in), g.cfg.MaxMessage)
			}
			if len(c.part.in) == 0 && c.part.msgOp == 0 {
				t.Fatal("an empty partial kept")
			}
		}
	})
}

type appendWriter struct{ b *[]byte }

func (w *appendWriter) Write(p []byte) (int, error) { *w.b = append(*w.b, p...); return len(p), nil }
