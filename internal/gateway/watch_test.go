package gateway_test

import (
	"bufio"
	"context"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/gateway"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testwait"
)

// watch subscribes c to ids and returns the snapshot's users.
func (c *client) watch(ids ...string) map[string]any {
	c.t.Helper()
	c.send(`{"type":"subscribe","user_ids":["` + strings.Join(ids, `","`) + `"]}`)
	m := c.msgType("snapshot")
	users, _ := m["users"].(map[string]any)
	return users
}

// presenceOf reads the next message, which must be a presence message of
// user with status.
func (c *client) presenceOf(user, status string) map[string]any {
	c.t.Helper()
	m := c.msgType("presence")
	if m["user_id"] != user || m["status"] != status {
		c.t.Fatalf("got %v, want %s %s", m, user, status)
	}
	return m
}

func TestSubscribeSnapshotAndEvents(t *testing.T) {
	n := newNode(t, opts{})
	target := n.dial("2", "p")
	target.msgType("welcome")
	w := n.dial("1", "")
	w.msgType("welcome")
	users := w.watch("2", "3", "2")
	if len(users) != 2 {
		t.Fatalf("snapshot %v", users)
	}
	u2, _ := users["2"].(map[string]any)
	if u2["status"] != "online" || u2["version"] == nil || u2["last_seen"] == nil || u2["status_text"] != nil {
		t.Fatalf("snapshot of 2: %v", u2)
	}
	u3, _ := users["3"].(map[string]any)
	if u3["status"] != "offline" || u3["last_seen"] != nil {
		t.Fatalf("snapshot of never-seen 3: %v", u3)
	}
	// Already watched ids are not in the next snapshot.
	if users := w.watch("2", "4"); len(users) != 1 || users["4"] == nil {
		t.Fatalf("second snapshot %v", users)
	}
	target.send(`{"type":"set_status","status":"busy","text":"meeting"}`)
	m := w.presenceOf("2", "busy")
	if m["status_text"] != "meeting" || m["version"].(float64) <= u2["version"].(float64) {
		t.Fatalf("presence %v after snapshot %v", m, u2)
	}
	// Bye: offline at once.
	target.send(`{"type":"bye"}`)
	target.closed(1000)
	w.presenceOf("2", "offline")
	// Unsubscribed users send nothing more.
	w.send(`{"type":"unsubscribe","user_ids":["2"]}`)
	w.silent(20 * time.Millisecond)
	t2 := n.dial("2", "p")
	t2.msgType("welcome")
	w.silent(50 * time.Millisecond)
}

// A connection that drops and comes back within the close grace shows
// nothing to watchers; one that does not come back is offline when the
// grace ends, long before its ttl.
func TestReconnectWithinCloseGraceIsSilent(t *testing.T) {
	n := newNode(t, opts{})
	target := n.dial("2", "phone")
	target.msgType("welcome")
	w := n.dial("1", "")
	w.msgType("welcome")
	w.watch("2")
	target.nc.Close() // the signal drops
	testwait.For(t, "drop", func() bool { return n.gw.Stats().Connections == 1 })
	n.clk.Advance(presence.DefaultCloseGrace - time.Millisecond)
	if _, err := n.tr.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	again := n.dial("2", "phone")
	again.msgType("welcome")
	n.clk.Advance(20 * time.Second)
	if _, err := n.tr.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	w.silent(100 * time.Millisecond)
	// A real drop is seen when the close grace ends, not the ttl.
	again.nc.Close()
	testwait.For(t, "drop", func() bool { return n.gw.Stats().Connections == 1 })
	n.clk.Advance(presence.DefaultCloseGrace - time.Millisecond)
	if _, err := n.tr.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	w.silent(50 * time.Millisecond)
	n.clk.Advance(time.Millisecond)
	if _, err := n.tr.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	w.presenceOf("2", "offline")
}

// A bye ends the device at once; the close that follows changes nothing
// more. A node shutting down does not shorten its devices' lives: their
// clients reconnect, maybe elsewhere, within the ttl.
func TestByeAndShutdownAreNoDisconnect(t *testing.T) {
	n := newNode(t, opts{})
	rec := n.record()
	c := n.dial("1", "phone")
	c.msgType("welcome")
	c.send(`{"type":"bye"}`)
	c.closed(1000)
	if evs := rec.of("1"); len(evs) != 2 || evs[1].Status != presence.Offline {
		t.Fatalf("events %+v, want online then offline", evs)
	}
	d := n.dial("2", "phone")
	d.msgType("welcome")
	n.stop()
	d.closed(1001)
	<-n.done
	n.clk.Advance(presence.DefaultCloseGrace + time.Second)
	if _, err := n.tr.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if evs := rec.of("2"); len(evs) != 1 {
		t.Fatalf("events of 2 %+v after a shutdown, want only the first online (the device keeps its ttl)", evs)
	}
}

func TestSubscriptionCap(t *testing.T) {
	n := newNode(t, opts{maxSubs: 3})
	w := n.dial("1", "")
	w.msgType("welcome")
	w.watch("a", "b")
	w.send(`{"type":"subscribe","user_ids":["c","d"]}`)
	w.errorCode("too_many_subscriptions")
	// Nothing of the refused request was added: c is new now.
	if users := w.watch("c"); len(users) != 1 || users["c"] == nil {
		t.Fatalf("snapshot %v", users)
	}
	// More ids than the cap in one request.
	w2 := n.dial("9", "")
	w2.msgType("welcome")
	w2.send(`{"type":"subscribe","user_ids":["a","b","c","d"]}`)
	w2.errorCode("too_many_subscriptions")
	// After unsubscribing there is room again.
	w.send(`{"type":"unsubscribe","user_ids":["a"]}`)
	if users := w.watch("d"); len(users) != 1 {
		t.Fatalf("snapshot %v", users)
	}
}

func TestPrivacyContactsOnly(t *testing.T) {
	n := newNode(t, opts{})
	ctx := context.Background()
	if err := n.tr.SetSettings(ctx, "2", presence.Settings{Status: presence.Contacts, LastSeen: presence.Contacts}); err != nil {
		t.Fatal(err)
	}
	if err := n.durable.SetContacts(ctx, "2", []string{"friend"}); err != nil {
		t.Fatal(err)
	}
	target := n.dial("2", "p")
	target.msgType("welcome")
	stranger := n.dial("stranger", "")
	stranger.msgType("welcome")
	friend := n.dial("friend", "")
	friend.msgType("welcome")
	if u := stranger.watch("2")["2"].(map[string]any); u["status"] != nil || u["last_seen"] != nil || u["version"] != nil || u["status_text"] != nil {
		t.Fatalf("stranger's snapshot %v", u)
	}
	if u := friend.watch("2")["2"].(map[string]any); u["status"] != "online" {
		t.Fatalf("friend's snapshot %v", u)
	}
	target.send(`{"type":"set_status","status":"away"}`)
	friend.presenceOf("2", "away")
	stranger.silent(50 * time.Millisecond)

	// 2 adds the stranger: from now on the stranger sees changes.
	if err := n.durable.SetContacts(ctx, "2", []string{"friend", "stranger"}); err != nil {
		t.Fatal(err)
	}
	n.hub.ContactsChanged(ctx, "2", []string{"friend", "stranger"}, nil)
	target.send(`{"type":"set_status","status":"busy"}`)
	friend.presenceOf("2", "busy")
	stranger.presenceOf("2", "busy")
}

func TestInvisibleLooksLikeLogout(t *testing.T) {
	n := newNode(t, opts{})
	target := n.dial("2", "p")
	target.msgType("welcome")
	w := n.dial("1", "")
	w.msgType("welcome")
	w.watch("2")
	target.send(`{"type":"set_status","status":"invisible"}`)
	m := w.presenceOf("2", "offline")
	if m["status_text"] != nil {
		t.Fatalf("presence %v", m)
	}
	// Heartbeats while invisible show nothing.
	target.send(`{"type":"heartbeat"}`)
	w.silent(50 * time.Millisecond)
	// A fresh watcher's snapshot reads offline, like a real logout.
	w2 := n.dial("3", "")
	w2.msgType("welcome")
	if u := w2.watch("2")["2"].(map[string]any); u["status"] != "offline" {
		t.Fatalf("snapshot %v", u)
	}
	// The user sees themselves as invisible.
	if u := target.watch("2")["2"].(map[string]any); u["status"] != "invisible" {
		t.Fatalf("own snapshot %v", u)
	}
}

// TestSlowConsumer: a watcher that never reads while its target flaps is
// closed 4002, and the hub keeps delivering to the others.
func TestSlowConsumer(t *testing.T) {
	n := newNode(t, opts{sndbuf: 4096, tweak: func(c *gateway.Config) { c.WriteTimeout = 300 * time.Millisecond }})
	ctx := context.Background()
	target := n.dial("2", "p")
	target.msgType("welcome")

	// The slow watcher has a tiny receive buffer and does not read.
	slow := n.dialSmallReceiveBuffer(ctx, "slow")
	slow.msgType("welcome")
	slow.watch("2")

	good := n.dial("good", "")
	good.msgType("welcome")
	good.watch("2")
	last := make(chan string, 1)
	go func() {
		for {
			f, err := good.frame(10 * time.Second)
			if err != nil {
				close(last)
				return
			}
			if strings.Contains(string(f.Payload), `"final"`) {
				last <- "final"
				return
			}
		}
	}()

	// The target flaps: online, offline (bye), online, ...
	start := time.Now()
	for i := 0; n.gw.Stats().ClosedSlow == 0; i++ {
		if i > 1000000 {
			t.Fatal("the slow watcher was never closed")
		}
		var err error
		if i%2 == 0 {
			_, err = n.tr.Bye(ctx, "2", "p")
		} else {
			_, err = n.tr.Heartbeat(ctx, "2", "p", true)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("closed after %s", time.Since(start))
	if _, err := n.tr.SetStatus(ctx, "2", presence.ManualAway, "final"); err != nil {
		t.Fatal(err)
	}
	select {
	case got, ok := <-last:
		if !ok || got != "final" {
			t.Fatal("the good watcher lost its stream")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the good watcher did not get the last change")
	}
	// The slow watcher, reading at last, learns why it was closed.
	slow.closed(4002)
}

// dialSmallReceiveBuffer connects user with a 1 KiB receive buffer, so
// what the client does not read soon fills the server's send buffer.
func (n *node) dialSmallReceiveBuffer(ctx context.Context, user string) *client {
	n.t.Helper()
	d := ws.Dialer{NetDial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		nd := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) {
				_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024)
			})
		}}
		return nd.DialContext(ctx, network, addr)
	}}
	nc, br, _, err := d.Dial(ctx, n.url+"/v1/ws?token="+n.token(user, ""))
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { nc.Close() })
	c := &client{t: n.t, nc: nc, r: bufio.NewReader(nc)}
	if br != nil {
		c.r = br
	}
	return c
}

// TestMassChangeIsNotSlow: every watched user changing at once (a mass
// expiry in one sweep) fits the queue of a healthy reader.
func TestMassChangeIsNotSlow(t *testing.T) {
	n := newNode(t, opts{})
	ctx := context.Background()
	ids := make([]string, 500)
	for i := range ids {
		ids[i] = "u" + strconv.Itoa(i)
		if _, err := n.tr.Heartbeat(ctx, ids[i], "d", true); err != nil {
			t.Fatal(err)
		}
	}
	w := n.dial("1", "")
	w.msgType("welcome")
	w.watch(ids...)
	// The watcher speaks at 20s (answered in order, so the snapshot shows
	// the heartbeat is applied); the others expire at 30s.
	n.clk.Advance(20 * time.Second)
	w.send(`{"type":"heartbeat"}`)
	w.watch("u0") // already watched: an empty snapshot
	n.clk.Advance(11 * time.Second)
	if _, err := n.tr.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for len(seen) < len(ids) {
		m := w.msgType("presence")
		if m["status"] != "offline" {
			t.Fatalf("presence %v", m)
		}
		seen[m["user_id"].(string)] = true
	}
	if s := n.gw.Stats(); s.ClosedSlow != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// What a subscribe's snapshot showed is not sent again: a resync that
// reads the same state sends nothing, and a change older than the
// snapshot that comes late (from the bus) is not sent; the next message
// is the next change.
func TestSnapshotIsNotSentAgain(t *testing.T) {
	n := newNode(t, opts{})
	target := n.dial("2", "p")
	target.msgType("welcome")
	w := n.dial("1", "")
	w.msgType("welcome")
	u2, _ := w.watch("2")["2"].(map[string]any)
	v, _ := u2["version"].(float64)
	if u2["status"] != "online" || v == 0 {
		t.Fatalf("snapshot of 2: %v", u2)
	}
	if err := n.hub.(*fanout.Hub).Resync(context.Background(), n.reader.Read); err != nil {
		t.Fatal(err)
	}
	n.hub.Publish(&presence.Event{UserID: "2", Status: presence.Away, Self: presence.Away, Version: uint64(v) - 1, At: 1})
	target.send(`{"type":"set_status","status":"busy"}`)
	m := w.presenceOf("2", "busy")
	if m["version"].(float64) <= v {
		t.Fatalf("presence %v after a snapshot at version %v", m, v)
	}
}

// A subscribe that says which versions the client holds (after a
// reconnect) is answered with the users whose view differs from those,
// and the count of the others; a user whose status the viewer may not
// see is always sent; a change that follows is delivered as usual.
func TestSubscribeWithKnownVersions(t *testing.T) {
	n := newNode(t, opts{})
	ctx := context.Background()
	for _, id := range []string{"2", "3", "4"} {
		c := n.dial(id, "p")
		c.msgType("welcome")
	}
	if err := n.tr.SetSettings(ctx, "4", presence.Settings{Status: presence.Nobody, LastSeen: presence.Nobody}); err != nil {
		t.Fatal(err)
	}
	w := n.dial("1", "")
	w.msgType("welcome")
	users := w.watch("2", "3", "4")
	version := func(id string) string {
		u, _ := users[id].(map[string]any)
		v, _ := u["version"].(float64)
		return strconv.FormatUint(uint64(v), 10)
	}
	if _, err := n.tr.SetStatus(ctx, "3", presence.ManualBusy, ""); err != nil {
		t.Fatal(err)
	}
	w.presenceOf("3", "busy")

	again := n.dial("1", "")
	again.msgType("welcome")
	again.send(`{"type":"subscribe","user_ids":["2","3","4"],"known":{"2":` + version("2") + `,"3":` + version("3") + `,"4":7}}`)
	m := again.msgType("snapshot")
	got, _ := m["users"].(map[string]any)
	if len(got) != 2 || got["3"] == nil || got["4"] == nil || m["unchanged"] != 1.0 {
		t.Fatalf("snapshot %v: want 3 (changed) and 4 (hidden), 2 unchanged", m)
	}
	if st := n.gw.Stats(); st.Unchanged != 1 {
		t.Fatalf("stats %+v: one user left out", st)
	}
	if _, err := n.tr.SetStatus(ctx, "2", presence.ManualAway, ""); err != nil {
		t.Fatal(err)
	}
	again.presenceOf("2", "away")
	// Without known versions, the snapshot is whole and has no count.
	third := n.dial("1", "")
	third.msgType("welcome")
	third.send(`{"type":"subscribe","user_ids":["2","3"]}`)
	if m := third.msgType("snapshot"); len(m["users"].(map[string]any)) != 2 || m["unchanged"] != nil {
		t.Fatalf("snapshot %v", m)
	}
}
