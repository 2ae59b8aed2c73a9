package tracker_test

import (
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testsvc"
)

func (n *node) sourceBeat(src uint32, user, dev string) presence.Change {
	n.t.Helper()
	ch, err := n.tr.SourceBeat(n.ctx, src, user, dev, true, false)
	if err != nil {
		n.t.Fatalf("SourceBeat(%d, %s, %s): %v", src, user, dev, err)
	}
	return ch
}

func (n *node) handOff(src uint32) {
	n.t.Helper()
	if err := n.tr.HandOffSources(n.ctx, src); err != nil {
		n.t.Fatalf("HandOffSources(%d): %v", src, err)
	}
}

// A node owns the devices whose heartbeats reach it from a source it
// consumes alone (a partition of an ingest), as it owns its sockets'
// devices: their beats make no Redis call. When the source moves, the
// node hands its devices off with their real last beats: one that the
// new consumer hears of again shows nothing, one it does not is
// announced offline once, at its last beat + ttl; a device the new
// consumer claimed before the hand-off (a partition lost, not revoked)
// stays the new consumer's.
func TestSourceHandOff(t *testing.T) {
	redis := testsvc.Redis(t)
	c := newCluster(t, redis)
	a, b := c.add(1), c.add(2)
	a.alive, b.alive = true, true

	a.sourceBeat(1, "alice", "phone")
	a.sourceBeat(1, "bob", "pc")
	a.sourceBeat(2, "carol", "tab")
	if got := strings.Join(a.events(), ";"); strings.Count(got, "offline→online") != 3 {
		t.Fatalf("claims published %q", got)
	}
	calls := scriptCalls(t, redis)
	for i := range 100 {
		c.at(time.Duration(i) * 10 * time.Millisecond)
		a.sourceBeat(1, "alice", "phone")
		a.sourceBeat(1, "bob", "pc")
		a.sourceBeat(2, "carol", "tab")
	}
	if n := scriptCalls(t, redis) - calls; n != 0 {
		t.Errorf("300 beats of devices a source of this node's brought ran %d scripts in Redis, want 0", n)
	}
	c.at(time.Second)
	a.sourceBeat(1, "alice", "phone")
	a.sourceBeat(1, "bob", "pc")
	a.sourceBeat(2, "carol", "tab")
	a.sourceBeat(2, "dave", "watch")
	a.pub.take()

	// Source 1 moves to b at 1.5 s: a hands alice and bob off.
	c.at(1500 * time.Millisecond)
	a.handOff(1)
	if s := a.tr.Stats(); s.OwnedDevices != 2 {
		t.Fatalf("a owns %d devices after handing source 1 off, want carol's and dave's", s.OwnedDevices)
	}
	if got := a.events(); len(got) != 0 {
		t.Fatalf("the hand-off published %v", got)
	}
	for i, s := range b.read("alice", "bob") {
		if s.Status != presence.Online {
			t.Errorf("b reads %d after the hand-off: %+v", i, s)
		}
	}
	// b hears of bob from source 1 at 2 s and claims him: nothing shows.
	c.at(2 * time.Second)
	if ch := b.sourceBeat(1, "bob", "pc"); ch.Changed {
		t.Fatalf("bob's claim by b changed %+v", ch.Event)
	}
	// Source 2 is lost by a (its session expired) and consumed by b,
	// which hears of dave first, at 2.5 s.
	c.at(2500 * time.Millisecond)
	b.sourceBeat(2, "dave", "watch")
	var got []string
	for at := 2600 * time.Millisecond; at <= 8*time.Second; at += 100 * time.Millisecond {
		c.at(at)
		if at%time.Second == 0 {
			b.sourceBeat(1, "bob", "pc")
			b.sourceBeat(2, "dave", "watch")
		}
		if at == 3*time.Second {
			a.handOff(2) // dave is b's already: a forgets him
			if s := a.tr.Stats(); s.OwnedDevices != 0 {
				t.Fatalf("a owns %d devices after handing everything off", s.OwnedDevices)
			}
		}
		c.tick(a, b)
		for _, e := range append(a.events(), b.events()...) {
			got = append(got, e+" at="+at.String())
		}
	}
	// alice's last beat was at 1 s (ttl 3 s), carol's too.
	want := []string{"alice online→offline seen=1s at=4s", "carol online→offline seen=1s at=4s"}
	if g := strings.Join(got, ";"); g != strings.Join(want, ";") && g != want[1]+";"+want[0] {
		t.Fatalf("after the hand-offs:\n\t%s\nwant\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
	for _, s := range a.read("bob", "dave") {
		if s.Status != presence.Online {
			t.Errorf("a reads %+v; b still hears of it", s)
		}
	}
	if n := a.tr.Stats().LeaseTakeovers + b.tr.Stats().LeaseTakeovers; n != 0 {
		t.Errorf("%d lease takeovers", n)
	}
}

// Source 0 is the node's sockets: no caller's source may be it.
func TestSourceZeroIsRefused(t *testing.T) {
	c := newCluster(t, testsvc.Redis(t))
	a := c.add(1)
	if _, err := a.tr.SourceBeat(a.ctx, 0, "alice", "phone", true, false); err == nil {
		t.Fatal("SourceBeat(0) was taken")
	}
	a.socketBeat("alice", "phone", true)
	a.handOff(0)
	if s := a.tr.Stats(); s.OwnedDevices != 1 {
		t.Fatalf("HandOffSources(0) handed the sockets' devices off: %d owned", s.OwnedDevices)
	}
}

// A connect claims the device again whatever the node knew of it: a
// device whose record another node's bye removed from Redis (the node
// still holding it as claimed) is back online with its next session,
// where plain beats would not tell Redis of it.
func TestSourceConnectClaimsAgain(t *testing.T) {
	redis := testsvc.Redis(t)
	c := newCluster(t, redis)
	a, b := c.add(1), c.add(2)
	a.alive, b.alive = true, true
	a.sourceBeat(1, "alice", "phone")
	if _, err := b.tr.Bye(b.ctx, "alice", "phone"); err != nil {
		t.Fatal(err)
	}
	c.at(100 * time.Millisecond)
	a.sourceBeat(1, "alice", "phone") // a still holds her: nothing to tell
	if s := b.read("alice")[0]; s.Status != presence.Offline {
		t.Fatalf("alice after the bye elsewhere: %+v", s)
	}
	c.at(200 * time.Millisecond)
	if _, err := a.tr.SourceBeat(a.ctx, 1, "alice", "phone", true, true); err != nil {
		t.Fatal(err)
	}
	if s := b.read("alice")[0]; s.Status != presence.Online {
		t.Fatalf("alice after her new session's connect: %+v", s)
	}
}
