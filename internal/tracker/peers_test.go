package tracker_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
)

// peersOf answers Ask with what the given trackers hold (Signs), as the
// peers package does over NATS; err, if set, is returned instead.
type peersOf struct {
	nodes []*tracker.Tracker
	err   error
	asked int
}

func (p *peersOf) Ask(ctx context.Context, ids []string, withStore bool) (tracker.Answers, error) {
	p.asked++
	var out tracker.Answers
	if p.err != nil {
		return out, p.err
	}
	for _, n := range p.nodes {
		out.Signs = n.Signs(n.Now(), ids, out.Signs)
		if withStore {
			out.Snapshots = n.StoreSnapshots(ctx, n.Now(), ids, out.Snapshots)
		}
	}
	return out, nil
}

// Two nodes whose store is down: node A reads the users who beat only on
// node B as B holds them — online while their devices live, with the
// status they chose (from the durable store), offline after a bye or
// once their last beat is a ttl old — and a failing question leaves A
// with what it knows itself.
func TestDegradedReadAsksPeers(t *testing.T) {
	d := newMemDurable()
	peers := &peersOf{}
	a := newOutageFixture(t, d, tracker.Config{Peers: peers})
	b := newOutageFixture(t, d, tracker.Config{})
	peers.nodes = []*tracker.Tracker{b.tr}
	b.beat("bob", "phone", true)
	b.beat("bea", "web", true)
	b.status("bea", presence.ManualBusy, "")
	b.beat("ivy", "pc", true)
	b.status("ivy", presence.ManualInvisible, "")
	a.sw.off.Store(true)
	b.sw.off.Store(true)
	for _, f := range []*outageFixture{a, b} {
		f.at(10 * time.Second)
		f.read("x") // notices the outage
	}
	b.beat("bob", "phone", true) // buffered on B
	b.beat("bea", "web", false)
	b.beat("ivy", "pc", true)
	b.beat("cal", "tab", true) // first seen during the outage
	got := a.read("bob", "bea", "ivy", "cal", "nobody")
	want := []presence.Status{presence.Online, presence.Busy, presence.Invisible, presence.Online, presence.Offline}
	for i, s := range got {
		if s.Status != want[i] {
			t.Errorf("node A reads %s %v, want %v (as node B holds it)", s.UserID, s.Status, want[i])
		}
	}
	if got[0].LastSeen != start.Add(10*time.Second).UnixMilli() {
		t.Errorf("bob's last_seen %d, want his buffered beat at +10s", got[0].LastSeen)
	}
	if st := a.tr.Stats(); st.PeerSigns == 0 || st.PeerAskErrors != 0 {
		t.Errorf("node A's stats %+v: want peer signs counted, no ask error", st)
	}

	// A bye on B ends the device for A's reads too; a ttl after his last
	// beat cal is offline as well.
	b.bye("bob", "phone")
	if s := a.read("bob")[0]; s.Status != presence.Offline {
		t.Errorf("after bob's bye on node B node A reads him %v", s.Status)
	}
	for _, f := range []*outageFixture{a, b} {
		f.at(10*time.Second + rules.TTL + time.Second)
	}
	if s := a.read("cal")[0]; s.Status != presence.Offline {
		t.Errorf("a ttl after cal's last beat node A reads him %v", s.Status)
	}

	// No peer answers: A reads what it holds itself, and counts it.
	peers.err = errors.New("no NATS")
	a.beat("dan", "phone", true)
	b.beat("bob", "phone", true)
	got = a.read("dan", "bob")
	if got[0].Status != presence.Online || got[1].Status != presence.Offline {
		t.Errorf("without peers node A reads dan %v (its own), bob %v (B's): want online, offline", got[0].Status, got[1].Status)
	}
	if st := a.tr.Stats(); st.PeerAskErrors == 0 {
		t.Error("a failed question is not counted")
	}
}

// While the store is up, reads do not ask the peers.
func TestReadsAskPeersOnlyWhenDegraded(t *testing.T) {
	peers := &peersOf{}
	a := newOutageFixture(t, newMemDurable(), tracker.Config{Peers: peers})
	a.beat("u", "d", true)
	if s := a.read("u", "v"); s[0].Status != presence.Online || peers.asked != 0 {
		t.Errorf("store up: read %v, peers asked %d times; want online, never asked", s[0].Status, peers.asked)
	}
}

// What a node answers a peer is each device's last beats and bye, not the
// beats the replay bridges a bye or a status with (one per device that
// beat around it: quadratic in a user's devices, for nothing a read
// needs), and the read from it is the same.
func TestSignsAreEachDevicesLastOnly(t *testing.T) {
	d := newMemDurable()
	peers := &peersOf{}
	a := newOutageFixture(t, d, tracker.Config{Peers: peers})
	b := newOutageFixture(t, d, tracker.Config{})
	peers.nodes = []*tracker.Tracker{b.tr}
	a.sw.off.Store(true)
	b.sw.off.Store(true)
	for _, f := range []*outageFixture{a, b} {
		f.read("x") // notices the outage
	}
	b.beat("u", "pc", true)
	for i := range 20 {
		b.at(time.Duration(i+1) * time.Second)
		dev := fmt.Sprint("tab", i)
		b.beat("u", dev, false)
		b.bye("u", dev)
		b.beat("u", "pc", true)
	}
	b.status("u", presence.ManualBusy, "")
	b.at(21 * time.Second)
	b.beat("u", "pc", false)
	signs := b.tr.Signs(b.tr.Now(), []string{"u"}, nil)
	perDevice := map[string]int{}
	for _, s := range signs {
		perDevice[s.Device]++
	}
	if perDevice["pc"] != 2 || len(signs) != 2+20*2 {
		t.Errorf("%d signs, %d of pc: want pc's last active beat and last beat, each tab's beat and bye (42)", len(signs), perDevice["pc"])
	}
	a.at(21 * time.Second)
	if s := a.read("u")[0]; s.Status != presence.Busy || s.LastSeen != start.Add(21*time.Second).UnixMilli() {
		t.Errorf("node A reads u %v, last_seen %d: want busy at +21s", s.Status, s.LastSeen)
	}
}

// futurePeer answers every question with one beat a minute ahead of the
// asker's clock, as a node with a skewed clock (or a forged answer) would.
type futurePeer struct {
	at    int64
	asked int
}

func (p *futurePeer) Ask(ctx context.Context, ids []string, _ bool) (tracker.Answers, error) {
	p.asked++
	var out tracker.Answers
	for _, id := range ids {
		out.Signs = append(out.Signs, tracker.DeviceSign{User: id, Device: "d", At: p.at, Active: true})
	}
	return out, nil
}

// A sign from the future reads as now, never as a last_seen ahead of the
// reader's clock; a read of settings while the store is down does not ask
// the peers (settings never come from them).
func TestPeerSignsClampedAndSettingsAskNobody(t *testing.T) {
	peer := &futurePeer{}
	f := newOutageFixture(t, newMemDurable(), tracker.Config{Peers: peer})
	f.sw.off.Store(true)
	f.at(10 * time.Second)
	peer.at = f.tr.Now() + time.Minute.Milliseconds()
	s := f.read("u")[0]
	if s.Status != presence.Online || s.LastSeen != f.tr.Now() {
		t.Errorf("read %v last_seen %d; want online, last seen now (%d), not in the future", s.Status, s.LastSeen, f.tr.Now())
	}
	asked := peer.asked
	if _, err := f.tr.Settings(f.ctx, "u"); err != nil {
		t.Fatal(err)
	}
	if peer.asked != asked {
		t.Error("a read of settings asked the peers")
	}
}

// Only node A is cut off from the store: node B, whose store answers,
// tells A how the store holds the users A asks about — a user beating
// over HTTP through B (no node holds them in memory) reads online on A,
// with their status text — and A's own buffered beats still count for a
// user the store shows gone.
func TestDegradedReadGetsTheStoreThroughAPeer(t *testing.T) {
	d := newMemDurable()
	peers := &peersOf{}
	a := newOutageFixture(t, d, tracker.Config{Peers: peers})
	b := newOutageFixture(t, d, tracker.Config{})
	peers.nodes = []*tracker.Tracker{b.tr}
	b.beat("hal", "pc", true)
	b.status("hal", presence.ManualNone, "at lunch")
	a.sw.off.Store(true)
	a.read("x")                  // A notices the outage
	a.beat("ida", "phone", true) // buffered on A; B's store never saw her
	got := a.read("hal", "ida")
	if got[0].Status != presence.Online || got[0].Text != "at lunch" || got[1].Status != presence.Online {
		t.Errorf("A cut off reads hal %v %q (B's store: online, at lunch) and ida %v (A's buffer: online)",
			got[0].Status, got[0].Text, got[1].Status)
	}
	if st := a.tr.Stats(); st.PeerSnapshots == 0 {
		t.Errorf("no snapshot from a peer counted: %+v", st)
	}
	// B cut off as well: it answers from memory only (hal's HTTP device
	// is in no node's memory: read as his durable profile).
	b.sw.off.Store(true)
	b.read("x")
	if s := a.read("hal")[0]; s.Status != presence.Offline {
		t.Errorf("with every store down, A reads hal %v; want his durable profile (offline)", s.Status)
	}
}
