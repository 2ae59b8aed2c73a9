package tracker_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/benchfix"
	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/tracker"
)

var leaseRules = presence.Rules{TTL: 3 * time.Second, IdleAfter: time.Minute, CloseGrace: time.Second}

// node is one tracker of a scale-out test: its own Redis client and
// fake clock, the shared Redis and durable store.
type node struct {
	t     *testing.T
	ctx   context.Context
	clock *clock.Fake
	pub   *recorder
	tr    *tracker.Tracker
	alive bool // what the other nodes' NodeAlive says of it
}

// cluster is nodes on one Redis (a key prefix of their own) and one
// durable store.
type cluster struct {
	t       *testing.T
	redis   *testsvc.Server
	prefix  string
	durable *memDurable
	nodes   []*node
	tweak   func(*tracker.Config) // if set, changes the next nodes' configuration
	rules   presence.Rules        // the next nodes' rules if TTL is set; leaseRules if not
}

func newCluster(t *testing.T, redis *testsvc.Server) *cluster {
	return &cluster{t: t, redis: redis, prefix: testsvc.Unique(t) + ":", durable: newMemDurable()}
}

// add starts node i (its epoch, so its lease, is i).
func (c *cluster) add(epoch uint64) *node { return c.addWith(epoch, nil) }

// addWith is add with the node's store wrapped by wrap (nil: as it is).
func (c *cluster) addWith(epoch uint64, wrap func(*redisstore.Store) tracker.Store) *node {
	c.t.Helper()
	n := c.addUnleased(epoch, wrap)
	n.tr.TickLease(n.ctx) // acquires the lease
	if n.tr.LeaseID() != epoch<<16|1 {
		c.t.Fatalf("lease of node %d: %d", epoch, n.tr.LeaseID())
	}
	return n
}

// addUnleased is addWith before the node's first lease tick: a node
// starting.
func (c *cluster) addUnleased(epoch uint64, wrap func(*redisstore.Store) tracker.Store) *node {
	t := c.t
	t.Helper()
	cl, err := redisstore.Dial(c.redis.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	r := leaseRules
	if c.rules.TTL != 0 {
		r = c.rules
	}
	r.Epoch = epoch
	rs, err := redisstore.Open(context.Background(), cl, redisstore.Config{Rules: r, Prefix: c.prefix})
	if err != nil {
		t.Fatal(err)
	}
	var store tracker.Store = rs
	if wrap != nil {
		store = wrap(rs)
	}
	n := &node{t: t, ctx: context.Background(), clock: clock.NewFake(start), pub: &recorder{}}
	cfg := tracker.Config{
		Store: store, Durable: c.durable, Publisher: n.pub, Clock: n.clock, Rules: r,
		LeaseInterval: 100 * time.Millisecond, ProbeInterval: 50 * time.Millisecond,
		NodeAlive: func(lease uint64) bool {
			for _, o := range c.nodes {
				if o.tr.LeaseID() == lease {
					return o.alive
				}
			}
			return false
		},
	}
	if c.tweak != nil {
		c.tweak(&cfg)
	}
	n.tr, err = tracker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.nodes = append(c.nodes, n)
	return n
}

// at sets every node's clock to start+d.
func (c *cluster) at(d time.Duration) {
	for _, n := range c.nodes {
		n.clock.Set(start.Add(d))
	}
}

// tick runs a lease tick and a sweep on every node in live.
func (c *cluster) tick(live ...*node) {
	c.t.Helper()
	for _, n := range live {
		n.tr.TickLease(n.ctx)
		n.sweep()
	}
}

func (n *node) socketBeat(user, dev string, active bool) presence.Change {
	n.t.Helper()
	ch, err := n.tr.SocketBeat(n.ctx, user, dev, active)
	if err != nil {
		n.t.Fatalf("SocketBeat(%s, %s): %v", user, dev, err)
	}
	return ch
}

// socketConnect is the first beat of a new socket.
func (n *node) socketConnect(user, dev string) presence.Change {
	n.t.Helper()
	ch, err := n.tr.SocketConnect(n.ctx, user, dev)
	if err != nil {
		n.t.Fatalf("SocketConnect(%s, %s): %v", user, dev, err)
	}
	return ch
}

func (n *node) sweep() {
	n.t.Helper()
	if _, err := n.tr.Sweep(n.ctx); err != nil {
		n.t.Fatalf("sweep: %v", err)
	}
}

func (n *node) read(users ...string) []presence.Snapshot {
	n.t.Helper()
	out := make([]presence.Snapshot, len(users))
	if err := n.tr.Get(n.ctx, n.tr.Now(), users, out); err != nil {
		n.t.Fatal(err)
	}
	return out
}

func (n *node) events() []string { return fmtEvents(n.pub.take()) }

// scriptCalls returns how many scripts Redis has run (INFO commandstats).
func scriptCalls(t *testing.T, srv *testsvc.Server) int64 {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n, err := benchfix.RedisScripts(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A node owns the devices whose sockets it holds: their beats make no
// Redis call, another node reads them online, a socket closed without
// bye ends its device after the close grace, and the departure is
// announced once, by the owner.
func TestOwnedDevices(t *testing.T) {
	redis := testsvc.Redis(t)
	c := newCluster(t, redis)
	a, b := c.add(1), c.add(2)
	a.alive, b.alive = true, true

	if got := a.events(); len(got) != 0 {
		t.Fatalf("events before any beat: %v", got)
	}
	a.socketBeat("alice", "phone", true)
	a.socketBeat("bob", "pc", true)
	if got := strings.Join(a.events(), ";"); !strings.Contains(got, "alice offline→online") || !strings.Contains(got, "bob offline→online") {
		t.Fatalf("claims published %q", got)
	}
	calls := scriptCalls(t, redis)
	for i := range 200 {
		c.at(time.Duration(i) * 10 * time.Millisecond)
		a.socketBeat("alice", "phone", true)
		a.socketBeat("bob", "pc", i%2 == 0)
	}
	if n := scriptCalls(t, redis) - calls; n != 0 {
		t.Errorf("400 beats of owned devices ran %d scripts in Redis, want 0", n)
	}
	for i, s := range b.read("alice", "bob") {
		if s.Status != presence.Online || s.Devices != 1 {
			t.Errorf("node b reads %d: %+v", i, s)
		}
	}
	// Well past the ttl of the last beat Redis heard of: alive, since
	// node a keeps beating them and renews its lease.
	for d := 2 * time.Second; d <= 12*time.Second; d += 100 * time.Millisecond {
		c.at(d)
		if d%(time.Second) == 0 {
			a.socketBeat("alice", "phone", true)
			a.socketBeat("bob", "pc", true)
		}
		c.tick(a, b)
	}
	if got := append(a.events(), b.events()...); len(got) != 0 {
		t.Fatalf("events while both kept beating: %v", got)
	}
	// bob's socket closes without a bye at 12 s: he is gone 1 s later,
	// announced by a with his last beat.
	c.at(12*time.Second + 500*time.Millisecond)
	if err := a.tr.Disconnect(a.ctx, "bob", "pc", ms(12*time.Second)); err != nil {
		t.Fatal(err)
	}
	c.at(13*time.Second + 400*time.Millisecond)
	c.tick(a, b)
	if got := append(a.events(), b.events()...); len(got) != 0 {
		t.Fatalf("events within the grace: %v", got)
	}
	c.at(13*time.Second + 500*time.Millisecond)
	c.tick(a, b)
	if got, want := strings.Join(a.events(), ";"), "bob online→offline seen=12s"; got != want {
		t.Fatalf("node a published %q at the end of bob's grace, want %q", got, want)
	}
	if got := b.events(); len(got) != 0 {
		t.Fatalf("node b published %v", got)
	}
	if s := b.read("bob")[0]; s.Status != presence.Offline || s.LastSeen != ms(12*time.Second) {
		t.Errorf("node b reads bob %+v", s)
	}
}

// A node that dies is taken over once its lease ran out: its devices
// live a ttl from its last renewal, and each departure is announced once,
// by one surviving node, with the last_seen the dead node checkpointed.
// A node cut off from Redis only (alive on the other channel) is not
// taken over; one whose lease was taken over while it still lived claims
// its devices again.
func TestDeadNodeIsTakenOver(t *testing.T) {
	redis := testsvc.Redis(t)
	c := newCluster(t, redis)
	a, b, d := c.add(1), c.add(2), c.add(3)
	b.alive, d.alive = true, true
	a.alive = true
	a.socketBeat("alice", "phone", true)
	a.socketBeat("carol", "tab", true)
	a.pub.take()
	for at := 100 * time.Millisecond; at <= time.Second; at += 100 * time.Millisecond {
		c.at(at)
		c.tick(a, b, d)
	}
	a.socketBeat("alice", "phone", true) // at 1 s
	a.socketBeat("carol", "tab", true)
	if err := a.tr.Checkpoint(a.ctx); err != nil {
		t.Fatal(err)
	}
	if p, _ := c.durable.profile("alice"); p.LastSeen != ms(time.Second) {
		t.Fatalf("alice's checkpoint by her owner: last_seen %v, want 1s", offset(p.LastSeen))
	}
	// a stops renewing at 1 s, but is still heard on the other channel:
	// nobody takes it over.
	for at := 1100 * time.Millisecond; at <= 3*time.Second; at += 100 * time.Millisecond {
		c.at(at)
		c.tick(b, d)
	}
	if s := c.redisStats(b); s.LeaseTakeovers != 0 {
		t.Fatalf("a node alive on the other channel was taken over")
	}
	// Now a is dead: a's lease (last renewed at 1 s) runs out after
	// three intervals of b's and d's clocks; the devices die at 1 s + ttl.
	a.alive = false
	var offline []string
	for at := 3100 * time.Millisecond; at <= 5*time.Second; at += 100 * time.Millisecond {
		c.at(at)
		c.tick(b, d)
		for _, e := range append(b.events(), d.events()...) {
			offline = append(offline, e+" at="+at.String())
		}
	}
	want := []string{"alice online→offline seen=1s at=4s", "carol online→offline seen=1s at=4s"}
	if strings.Join(offline, ";") != strings.Join(want, ";") && strings.Join(offline, ";") != want[1]+";"+want[0] {
		t.Fatalf("departures after a's death:\n\t%s\nwant\n\t%s", strings.Join(offline, "\n\t"), strings.Join(want, "\n\t"))
	}
	if n := c.redisStats(b).LeaseTakeovers + c.redisStats(d).LeaseTakeovers; n != 1 {
		t.Errorf("%d takeovers of a's lease, want 1", n)
	}
	// a was not dead after all (cut off for longer than its lease): it
	// finds its lease taken over, takes a new one and claims its devices
	// again — alice is back.
	c.at(5100 * time.Millisecond)
	a.socketBeat("alice", "phone", true)
	c.tick(a)
	c.at(5200 * time.Millisecond)
	c.tick(a)
	if a.tr.LeaseID() != 1<<16|2 {
		t.Fatalf("a's lease after it was taken over: %d, want a new one", a.tr.LeaseID())
	}
	if got := strings.Join(a.events(), ";"); !strings.Contains(got, "alice offline→online") {
		t.Fatalf("a published %q after it claimed its devices again", got)
	}
	if s := b.read("alice")[0]; s.Status != presence.Online {
		t.Errorf("b reads alice %+v after a came back", s)
	}
}

func (c *cluster) redisStats(n *node) tracker.Stats { return n.tr.Stats() }

// A node that stops hands its devices off: each lives its ttl from its
// real last beat, so a client that reconnects elsewhere within it shows
// nothing, and one that does not is announced offline once, by another
// node's sweep, at its last beat + ttl.
func TestStoppingNodeHandsOff(t *testing.T) {
	redis := testsvc.Redis(t)
	c := newCluster(t, redis)
	a, b := c.add(1), c.add(2)
	a.alive, b.alive = true, true
	a.socketBeat("alice", "phone", true)
	a.socketBeat("bob", "pc", true)
	c.at(time.Second)
	a.socketBeat("alice", "phone", true)
	a.socketBeat("bob", "pc", true)
	a.pub.take()
	c.at(1500 * time.Millisecond)
	if err := a.tr.Close(a.ctx); err != nil {
		t.Fatal(err)
	}
	a.alive = false
	if a.tr.LeaseID() != 0 {
		t.Errorf("a still holds its lease after Close")
	}
	if got := a.events(); len(got) != 0 {
		t.Fatalf("the hand-off published %v", got)
	}
	// bob reconnects to b within the ttl: nothing shows.
	c.at(2 * time.Second)
	if ch := b.socketBeat("bob", "pc", true); ch.Changed {
		t.Fatalf("bob's reconnect to b changed %+v", ch.Event)
	}
	var got []string
	for at := 2100 * time.Millisecond; at <= 5*time.Second; at += 100 * time.Millisecond {
		c.at(at)
		if at%time.Second == 0 {
			b.socketBeat("bob", "pc", true) // bob keeps beating on b
		}
		c.tick(b)
		for _, e := range b.events() {
			got = append(got, e+" at="+at.String())
		}
	}
	if want := "alice online→offline seen=1s at=4s"; strings.Join(got, ";") != want {
		t.Fatalf("after a's hand-off b published %v, want [%s]", got, want)
	}
	if n := b.tr.Stats().LeaseTakeovers; n != 0 {
		t.Errorf("b took over %d leases; a handed off and ended its lease", n)
	}
}

// A node whose lease is gone with Redis's data, the version floor raised
// again by another node that noticed the loss first, and none of whose own
// calls failed, asks for its watchers to be resynced all the same: what
// they show may have been lost with the data.
func TestLeaseLostAsksForAResync(t *testing.T) {
	redis := testsvc.Redis(t)
	c := newCluster(t, redis)
	var recovered atomic.Int32
	c.tweak = func(cfg *tracker.Config) { cfg.OnRecover = func() { recovered.Add(1) } }
	a := c.add(1)
	a.alive = true
	a.socketConnect("alice", "phone")
	c.tick(a)
	cl, err := redisstore.Dial(redis.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.Do(context.Background(), cl.B().Flushall().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	other, err := redisstore.Open(context.Background(), cl, redisstore.Config{Rules: leaseRules, Prefix: c.prefix})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.RaiseFloor(context.Background(), 9<<32); err != nil {
		t.Fatal(err)
	}
	c.at(200 * time.Millisecond)
	c.tick(a)
	if a.tr.Stats().LeaseLosses != 1 {
		t.Fatalf("lease losses %d, want 1", a.tr.Stats().LeaseLosses)
	}
	if n := recovered.Load(); n != 1 {
		t.Errorf("OnRecover called %d times after the lease was lost with the data, want 1", n)
	}
}
