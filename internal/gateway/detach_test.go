//go:build linux

package gateway_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/presenced/presenced/internal/gateway"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testwait"
)

// A plain socket is read and written on its own descriptor, without its
// net.Conn (an idle socket then costs no netFD, addresses or runtime poll
// descriptor); it keeps its place in the connection budget until it
// closes, and gives it back then. A TLS socket keeps its tls.Conn.
func TestPlainSocketsAreDetached(t *testing.T) {
	n := newNode(t, opts{budget: true})
	var cs []*client
	for _, u := range []string{"1", "2", "3"} {
		c := n.dial(u, "d")
		c.msgType("welcome")
		cs = append(cs, c)
	}
	if d, open := gateway.Detached(n.gw); d != 3 || open != 3 {
		t.Fatalf("%d of %d sockets detached, want 3 of 3", d, open)
	}
	// The harness's readiness probe's connection may be open a moment
	// longer: the budget's count comes down to the three sockets.
	testwait.Forf(t, func() string { return fmt.Sprintf("the budget to count 3 open: %+v", n.budget.Stats()) },
		func() bool { return n.budget.Stats().Open == 3 })
	// Each one still reads and writes: a watch is answered with a snapshot.
	for _, c := range cs {
		c.watch("1")
	}
	cs[0].nc.Close()
	testwait.For(t, "the closed socket's place given back", func() bool {
		_, open := gateway.Detached(n.gw)
		return open == 2 && n.budget.Stats().Open == 2
	})
	// The server closes one (a bye is not a close; an idle timeout is).
	cs[1].send(`{"type":"bye"}`)
	cs[1].nc.Close()
	testwait.For(t, "both places given back", func() bool { return n.budget.Stats().Open == 1 })

	tn := newNode(t, opts{tls: true})
	tc := tn.dial("1", "d")
	tc.msgType("welcome")
	if d, open := gateway.Detached(tn.gw); d != 0 || open != 1 {
		t.Fatalf("%d of %d TLS sockets detached, want 0 of 1", d, open)
	}
}

// A watcher that stops reading for a while, shorter than the write
// timeout, loses nothing: the writer of its detached socket waits for room
// (EPOLLOUT on the gateway's second epoll instance) and goes on.
func TestSlowReaderThatResumesGetsEverything(t *testing.T) {
	n := newNode(t, opts{sndbuf: 4096, tweak: func(c *gateway.Config) { c.WriteTimeout = 10 * time.Second }})
	ctx := context.Background()
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = fmt.Sprint("u", i)
		if _, err := n.tr.Heartbeat(ctx, ids[i], "d", true); err != nil {
			t.Fatal(err)
		}
	}
	slow := n.dialSmallReceiveBuffer(ctx, "slow")
	slow.msgType("welcome")
	slow.watch(ids...)
	if d, _ := gateway.Detached(n.gw); d != 1 {
		t.Fatalf("%d sockets detached, want 1", d)
	}
	// ~100 × 500 bytes: far more than the two socket buffers (4 + 1 KiB).
	text := strings.Repeat("x", 450)
	for _, id := range ids {
		if _, err := n.tr.SetStatus(ctx, id, presence.ManualBusy, text); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, "the writer to find the buffers full and wait for room", func() bool { return gateway.WritersWaiting(n.gw) > 0 })
	seen := map[string]bool{}
	for len(seen) < len(ids) {
		m := slow.msgType("presence")
		if m["status"] != "busy" || m["status_text"] != text {
			t.Fatalf("presence %v", m)
		}
		seen[m["user_id"].(string)] = true
	}
	if s := n.gw.Stats(); s.ClosedSlow != 0 {
		t.Fatalf("closed as slow: %+v", s)
	}
}

// Messages that arrive faster than one read takes them in — here more than
// four read buffers in one write — are all read: the connection goes back
// to the end of the workers' queue and is read again, without another
// byte from its client.
func TestBurstLongerThanAReadTurnIsReadToTheEnd(t *testing.T) {
	n := newNode(t, opts{tweak: func(c *gateway.Config) { c.Rate, c.Burst = 1000, 1000 }})
	c := n.dial("burst", "d")
	c.msgType("welcome")
	var buf bytes.Buffer
	const big = 4
	for i := range big {
		// 600 ids, more than a connection may watch: refused whole, after
		// all of it was read.
		ids := make([]string, 600)
		for k := range ids {
			ids[k] = fmt.Sprintf(`"u%d-%0*d"`, i, 55, k)
		}
		msg := `{"type":"subscribe","user_ids":[` + strings.Join(ids, ",") + `]}`
		f := ws.MaskFrameInPlace(ws.NewTextFrame([]byte(msg)))
		if err := ws.WriteFrame(&buf, f); err != nil {
			t.Fatal(err)
		}
	}
	if err := ws.WriteFrame(&buf, ws.MaskFrameInPlace(ws.NewTextFrame([]byte(`{"type":"subscribe","user_ids":["last"]}`)))); err != nil {
		t.Fatal(err)
	}
	if buf.Len() < 5*16<<10 {
		t.Fatalf("a burst of %d bytes is no longer than four reads", buf.Len())
	}
	_ = c.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.nc.Write(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	for range big {
		c.errorCode("too_many_subscriptions")
	}
	if m := c.msgType("snapshot"); m["users"].(map[string]any)["last"] == nil {
		t.Fatalf("snapshot %v does not name the last message's user", m)
	}
}
