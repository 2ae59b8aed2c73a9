package tracker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tracker"
)

// faultyStore is a Redis store whose next AcquireLease fails, or whose
// next Claim is applied by Redis but answered with an error (a reply
// lost to a timeout or a dropped connection).
type faultyStore struct {
	*redisstore.Store
	failAcquire atomic.Bool
	loseClaim   atomic.Bool
	failTouch   atomic.Bool
}

func (s *faultyStore) Touch(ctx context.Context, now int64, lease uint64, touches []tracker.Touch) {
	if s.failTouch.CompareAndSwap(true, false) {
		for i := range touches {
			touches[i].Err = errLostReply
		}
		return
	}
	s.Store.Touch(ctx, now, lease, touches)
}

var errLostReply = errors.New("reply lost (i/o timeout)")

func (s *faultyStore) AcquireLease(ctx context.Context, lease uint64, now int64) error {
	if s.failAcquire.CompareAndSwap(true, false) {
		return errLostReply
	}
	return s.Store.AcquireLease(ctx, lease, now)
}

func (s *faultyStore) Claim(ctx context.Context, now int64, lease uint64, user string, d tracker.OwnedDevice) (presence.Change, error) {
	ch, err := s.Store.Claim(ctx, now, lease, user, d)
	if err == nil && s.loseClaim.CompareAndSwap(true, false) {
		return presence.Change{}, errLostReply
	}

	return ch, err
}

// addFaulty is cluster.add with a faultyStore.
func (c *cluster) addFaulty(epoch uint64) (*node, *faultyStore) {
	var fs *faultyStore
	n := c.addWith(epoch, func(rs *redisstore.Store) tracker.Store {
		fs = &faultyStore{Store: rs}
		return fs
	})
	return n, fs
}

// A device that moves A → B → A within its ttl (LB round robin, a
// flaky mobile network): A's table still holds it as claimed, so A's
// beats make no call; B's close grace then ends the device B owns in
// Redis, and the user reads offline while A's socket keeps beating.
func TestReconnectToFormerOwner(t *testing.T) {
	redis := testsvc.Redis(t)
	c := newCluster(t, redis)
	a, b := c.add(1), c.add(2)
	a.alive, b.alive = true, true

	a.socketBeat("alice", "phone", true) // A claims
	// 0.5 s: the phone's socket to A goes half-open (A sees no close);
	// the phone reconnects and lands on B, which claims it.
	c.at(500 * time.Millisecond)
	b.socketConnect("alice", "phone")
	// 1 s: the socket to B drops (B sees the close); the phone
	// reconnects and lands on A again.
	c.at(time.Second)
	if err := b.tr.Disconnect(b.ctx, "alice", "phone", ms(500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	a.socketConnect("alice", "phone") // a new socket: A claims it again
	a.pub.take()
	b.pub.take()
	// The phone keeps beating on A every 500 ms for 10 s (> ttl 3 s).
	for at := 1100 * time.Millisecond; at <= 11*time.Second; at += 100 * time.Millisecond {
		c.at(at)
		if at%(500*time.Millisecond) == 0 {
			a.socketBeat("alice", "phone", true)
		}
		c.tick(a, b)
	}
	evs := append(a.events(), b.events()...)
	if s := b.read("alice")[0]; s.Status != presence.Online || len(evs) != 0 {
		t.Fatalf("alice beats on A all along, yet reads %v (devices %d); events %v", s.Status, s.Devices, evs)
	}
}

// A node finds its lease taken over and fails to take a new one at
// once (the store hiccups again); the next tick takes one but never
// claims the devices again, so the devices that keep beating on it die
// with the old lease's takeover.
func TestLeaseReacquiredAfterFailureReclaims(t *testing.T) {
	redis := testsvc.Redis(t)
	c := newCluster(t, redis)
	a, fa := c.addFaulty(1)
	b := c.add(2)
	a.alive, b.alive = true, true
	a.socketBeat("alice", "phone", true)
	for at := 100 * time.Millisecond; at <= time.Second; at += 100 * time.Millisecond {
		c.at(at)
		c.tick(a, b)
	}
	// a is cut off from everything for 2 s: b takes its lease over.
	a.alive = false
	for at := 1100 * time.Millisecond; at <= 3*time.Second; at += 100 * time.Millisecond {
		c.at(at)
		c.tick(b)
	}
	if b.tr.Stats().LeaseTakeovers != 1 {
		t.Fatalf("b did not take a's lease over")
	}
	a.alive = true
	// a is back: its renewal finds the lease taken; the new lease's
	// acquisition fails once (the store goes down), the store answers
	// again and the next tick acquires one.
	fa.failAcquire.Store(os.Getenv("REVIEW_CONTROL") == "")
	c.at(3100 * time.Millisecond)
	a.socketBeat("alice", "phone", true)
	c.tick(a, b)
	a.tr.Recover(a.ctx)
	for at := 3200 * time.Millisecond; at <= 12*time.Second; at += 100 * time.Millisecond {
		c.at(at)
		if at%(500*time.Millisecond) == 0 {
			a.socketBeat("alice", "phone", true)
		}
		a.tr.Recover(a.ctx)
		c.tick(a, b)
	}
	if a.tr.LeaseID() == 0 || a.tr.LeaseID() == 1<<16|1 {
		t.Fatalf("a's lease: %d", a.tr.LeaseID())
	}
	if s := b.read("alice")[0]; s.Status != presence.Online {
		t.Fatalf("alice kept beating on a (lease %d), yet reads %v; a published %v, b %v",
			a.tr.LeaseID(), s.Status, a.events(), b.events())
	}
}

// A claim Redis applied but whose reply was lost (timeout): the table
// keeps the device unclaimed; if it ends before a claim succeeds it is
// dropped as "never shown", and Redis holds it online under the node's
// live lease for ever.
func TestLostClaimReplyLeavesGhost(t *testing.T) {
	redis := testsvc.Redis(t)
	c := newCluster(t, redis)
	a, fa := c.addFaulty(1)
	b := c.add(2)
	a.alive, b.alive = true, true
	fa.loseClaim.Store(os.Getenv("REVIEW_CONTROL") == "")
	if _, err := a.tr.SocketBeat(a.ctx, "alice", "phone", true); err != nil {
		t.Fatal(err)
	}
	if os.Getenv("REVIEW_CONTROL") == "" && !a.tr.StoreDown() {
		t.Fatalf("a lost claim reply did not count as an outage")
	}
	// The client leaves during the outage (socket closed, no bye).
	c.at(200 * time.Millisecond)
	if err := a.tr.Disconnect(a.ctx, "alice", "phone", ms(0)); err != nil {
		t.Fatal(err)
	}
	// The store answers again after the close grace (1 s).
	c.at(1500 * time.Millisecond)
	a.tr.Recover(a.ctx)
	for at := 1600 * time.Millisecond; at <= 30*time.Second; at += 100 * time.Millisecond {
		c.at(at)
		a.tr.Recover(a.ctx)
		c.tick(a, b)
	}
	if n := a.tr.Stats().OwnedDevices; n != 0 {
		t.Fatalf("a still holds %d devices", n)
	}
	if s := b.read("alice")[0]; s.Status != presence.Offline {
		t.Fatalf("alice left at 0.2 s (grace 1 s, ttl 3 s); at 30 s she reads %v with %d devices", s.Status, s.Devices)
	}
}

// One batch of idle touches fails (a Redis blip); the probe finds Redis
// back within Retry and recover's syncOwned calls Due, which spins for
// ever on the shard lock (see owned.TestReviewFailedIdleTouchDoesNotSpinDue):
// the Run goroutine hangs — no sweep, no lease renewal — and every
// SocketBeat of that shard blocks.
func TestFailedIdleTouchHangsSweep(t *testing.T) {
	redis := testsvc.Redis(t)
	c := newCluster(t, redis)
	a, fa := c.addFaulty(1)
	a.alive = true
	a.socketBeat("alice", "phone", true)
	for at := time.Second; at < time.Minute; at += time.Second {
		c.at(at)
		a.socketBeat("alice", "phone", false)
		c.tick(a)
	}
	fa.failTouch.Store(true)
	c.at(time.Minute + 100*time.Millisecond)
	a.socketBeat("alice", "phone", false)
	a.sweep() // the idle touch fails: the store is marked down
	if !a.tr.StoreDown() {
		t.Fatalf("the failed touch did not mark the store down")
	}
	done := make(chan struct{})
	go func() {
		a.tr.Recover(a.ctx) // Redis answers: replay, then syncOwned
		_, _ = a.tr.Sweep(a.ctx)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("recover/sweep after one failed idle touch did not return within 5 s")
	}
}

// A claim Redis applied but could not replicate in time (the primary's
// replica frozen, as when the primary is cut off from it) is not taken as
// an outage: the store is not marked down, and the claim is retried until
// it is acknowledged; only then is the arrival announced, once, and the
// user reads online on every node.
func TestClaimNotReplicatedIsRetried(t *testing.T) {
	primary, replica := testsvc.Redis(t), testsvc.Redis(t)
	rc, err := redisstore.Dial(replica.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	host, port, _ := strings.Cut(primary.Addr, ":")
	ctx := context.Background()
	if err := rc.Do(ctx, rc.B().Replicaof().Host(host).Port(mustAtoi(t, port)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	pc, err := redisstore.Dial(primary.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	testwait.For(t, "the replica in sync", func() bool {
		var acked int64
		_ = pc.Dedicated(func(dc rueidis.DedicatedClient) error {
			r := dc.DoMulti(ctx, dc.B().Set().Key("sync").Value("1").Build(), dc.B().Wait().Numreplicas(1).Timeout(100).Build())
			acked, _ = r[1].AsInt64()
			return nil
		})
		return acked == 1
	})
	c := newCluster(t, primary)
	a, b := c.add(1), c.add(2)
	a.alive, b.alive = true, true
	// now steps the fake clock on by the claim retry's 100 ms, so a
	// claim whose WAIT ran out on a loaded machine is tried again.
	var now time.Duration
	step := func() {
		now += 100 * time.Millisecond
		c.at(now)
		c.tick(a, b)
	}
	// All well: the store learns of the replica.
	if _, err := a.tr.SocketConnect(a.ctx, "bob", "phone"); err != nil && !errors.Is(err, tracker.ErrNotReplicated) {
		t.Fatalf("connect with the replica in sync: %v", err)
	}
	var evs []string
	testwait.Forf(t, func() string { return fmt.Sprintf("bob's arrival, seen %v", evs) }, func() bool {
		if evs = append(evs, a.events()...); len(evs) > 0 {
			return true
		}
		step()
		return false
	})
	if len(evs) != 1 {
		t.Fatalf("bob's arrival: %v", evs)
	}
	if err := replica.Pause(); err != nil {
		t.Fatal(err)
	}
	step()
	if _, err := a.tr.SocketConnect(a.ctx, "carol", "phone"); err != nil && !errors.Is(err, tracker.ErrNotReplicated) {
		t.Fatalf("connect while claims are not replicated: %v", err)
	}
	for range 3 {
		step()
	}
	if st := a.tr.Stats(); st.Down || a.tr.Degraded() {
		t.Fatalf("claims not replicated marked the store down: %+v", st)
	}
	if evs := a.events(); len(evs) != 0 {
		t.Fatalf("announced before the claim could not be lost: %v", evs)
	}
	if err := replica.Resume(); err != nil {
		t.Fatal(err)
	}
	testwait.Forf(t, func() string {
		return fmt.Sprintf("carol online once the replica is back (reads %v)", b.read("carol")[0].Status)
	}, func() bool {
		step()
		return b.read("carol")[0].Status == presence.Online && a.pub.count() > 0
	})
	if evs := a.events(); len(evs) != 1 || !strings.Contains(evs[0], "carol") || !strings.Contains(evs[0], "online") {
		t.Fatalf("events: %v, want carol online once", evs)
	}
}

func mustAtoi(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A socket that connects before its node holds a lease (the node is
// starting) is alive on the node, and its claim waits for the lease: a
// join of a room from it meanwhile waits for the lease and the claim,
// and is not refused as a device the store does not know.
func TestJoinBeforeTheNodesLease(t *testing.T) {
	redis := testsvc.Redis(t)
	c := newCluster(t, redis)
	n := c.addUnleased(1, nil)
	n.socketConnect("alice", "phone") // no lease: the claim waits
	joined := make(chan error, 1)
	go func() {
		_, err := n.tr.Join(n.ctx, "alice", "phone", "doc")
		joined <- err
	}()
	n.tr.TickLease(n.ctx)
	if err := <-joined; err != nil {
		t.Fatalf("join of a connected device before the node's lease: %v", err)
	}
	pg, err := n.tr.RoomPage(n.ctx, "doc", "", 10, nil)
	if err != nil || fmt.Sprint(pg.Members) != "[alice]" {
		t.Fatalf("room doc: %+v, %v; want alice", pg, err)
	}
	// A device the node does not hold is still refused at once.
	if _, err := n.tr.Join(n.ctx, "bob", "phone", "doc"); !errors.Is(err, presence.ErrDeviceNotAlive) {
		t.Fatalf("join of a device never seen: %v, want ErrDeviceNotAlive", err)
	}
}
