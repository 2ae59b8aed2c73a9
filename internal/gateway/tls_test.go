package gateway_test

import (
	"strings"
	"testing"

	"github.com/gobwas/ws"
)

// TestWSS: over TLS (epoll on, as on Linux by default) a connection is
// read and written through its tls.Conn: the whole round trip — welcome,
// a message sent with the handshake's bytes, fragments, subscribe and
// snapshot, a change fanned out, bye and the close frame, shutdown — works.
// Polling such a socket's fd would hand the gateway TLS records, which it
// would refuse as a protocol error; writing to the fd would break the
// client's TLS.
func TestWSS(t *testing.T) {
	n := newNode(t, opts{tls: true})
	if !strings.HasPrefix(n.url, "wss://") {
		t.Fatalf("url %s", n.url)
	}
	target := n.dial("2", "p")
	target.msgType("welcome")
	w := n.dial("1", "")
	w.msgType("welcome")
	users := w.watch("2")
	if u2, _ := users["2"].(map[string]any); u2["status"] != "online" {
		t.Fatalf("snapshot over TLS: %v", users)
	}
	// A message in three fragments, then one larger than a TLS record.
	msg := []byte(`{"type":"set_status","status":"busy","text":"meeting"}`)
	target.sendFrame(ws.OpText, false, msg[:10])
	target.sendFrame(ws.OpContinuation, false, msg[10:30])
	target.sendFrame(ws.OpContinuation, true, msg[30:])
	if m := w.presenceOf("2", "busy"); m["status_text"] != "meeting" {
		t.Fatalf("presence over TLS: %v", m)
	}
	long := strings.Repeat("x", 20000)
	target.send(`{"type":"set_status","status":"away","text":"` + long + `"}`)
	target.errorCode("invalid_text") // read in full through several records, answered
	st := n.gw.Stats()
	if st.EpollDisabled {
		t.Fatal("epoll is off: the test would not show that TLS connections leave it")
	}
	if st.Accepted != 2 || st.AcceptedTLS != 2 || st.Connections != 2 {
		t.Fatalf("stats %+v, want 2 accepted over TLS, 2 open", st)
	}
	target.send(`{"type":"bye"}`)
	target.closed(1000)
	w.presenceOf("2", "offline")
	n.stop()
	w.closed(1001)
}
