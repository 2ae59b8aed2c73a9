package gateway_test

import (
	"bufio"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/presenced/presenced/internal/admission"
	"github.com/presenced/presenced/internal/gateway"
	"github.com/presenced/presenced/internal/testwait"
)

// A handshake, from its authentication to its welcome, and a
// connection's first subscribe each wait for their turn at the setup
// gate; one that waits too long is refused and changes nothing. The
// connection's later subscribes do not wait.
func TestSetupTakesTurns(t *testing.T) {
	n := newNode(t, opts{tweak: func(c *gateway.Config) {
		// One at a time, whatever the probe sees.
		c.Setup = admission.Config{Max: 1, Start: 1, MaxWait: time.Second}
	}})
	rec := n.record()
	gate := gateway.SetupGate(n.gw)
	ctx := context.Background()
	if err := gate.Enter(ctx); err != nil { // a setup in progress
		t.Fatal(err)
	}

	// Waiting longer than MaxWait: 503, and 7 is not online.
	if code, m := upgradeReq(t, n, "?token="+n.token("7", ""), nil); code != http.StatusServiceUnavailable || errCode(m) != "unavailable" {
		t.Fatalf("behind a full gate: %d %v, want 503 unavailable", code, m)
	}
	if evs := rec.of("7"); len(evs) != 0 {
		t.Fatalf("a refused handshake changed 7: %+v", evs)
	}
	if s := n.gw.Stats().Setup; s.Busy != 1 {
		t.Fatalf("setup stats %+v, want one busy", s)
	}

	// Waiting less: welcomed once the setup before it is done.
	type dialed struct {
		c   *client
		err error
	}
	got := make(chan dialed, 1)
	go func() {
		nc, br, _, err := ws.Dialer{Timeout: 5 * time.Second}.Dial(ctx, n.url+"/v1/ws?token="+n.token("8", ""))
		if err != nil {
			got <- dialed{err: err}
			return
		}
		c := &client{t: t, nc: nc, r: br}
		if br == nil {
			c.r = bufio.NewReader(nc)
		}
		got <- dialed{c: c}
	}()
	testwait.For(t, "the handshake to wait", func() bool { return n.gw.Stats().Setup.Waiting == 1 })
	select {
	case d := <-got:
		t.Fatalf("upgraded past a full gate (%v)", d.err)
	case <-time.After(50 * time.Millisecond):
	}
	if evs := rec.of("8"); len(evs) != 0 {
		t.Fatalf("8 connected before its turn: %+v", evs)
	}
	gate.Leave()
	d := <-got
	if d.err != nil {
		t.Fatal(d.err)
	}
	t.Cleanup(func() { d.c.nc.Close() })
	d.c.msgType("welcome")
	testwait.For(t, "8 online", func() bool { return len(rec.of("8")) == 1 })

	// The connection's first subscribe waits too.
	testwait.For(t, "the handshake to leave the gate", func() bool { return n.gw.Stats().Setup.InFlight == 0 })
	if err := gate.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	d.c.send(`{"type":"subscribe","user_ids":["7"]}`)
	d.c.silent(100 * time.Millisecond)
	gate.Leave()
	if m := d.c.msgType("snapshot"); m["users"] == nil {
		t.Fatalf("snapshot %v", m)
	}

	// Its later ones do not: the session is set up.
	if err := gate.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	defer gate.Leave()
	d.c.send(`{"type":"subscribe","user_ids":["9"]}`)
	if m := d.c.msgType("snapshot"); m["users"] == nil {
		t.Fatalf("snapshot %v", m)
	}
	if s := n.gw.Stats().Setup; s.Waiting != 0 {
		t.Fatalf("setup stats %+v: a later subscribe waited", s)
	}
}

// errCode is the code of an API error body.
func errCode(m map[string]any) any {
	e, _ := m["error"].(map[string]any)
	return e["code"]
}
