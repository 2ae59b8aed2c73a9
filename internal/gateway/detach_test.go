//go:build linux

package gateway_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

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
