package tracker_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
)

// silentParts is a tracker.Store over a memstore in n parts, as a Redis
// Cluster whose shards are parts: user "u<i>" is in part i. While silent,
// a master holding every part hangs: calls about its users fail, and a
// ping of a part answers only when its context ends (a paused process, a
// silent network), as a real client bounded by StoreTimeout does.
type silentParts struct {
	tracker.Store
	n      int
	silent atomic.Bool
	// pings in flight now, and the most at once
	inflight, most atomic.Int64
}

func (s *silentParts) Parts() int                 { return s.n }
func (s *silentParts) Ping(context.Context) error { return nil }

func (s *silentParts) Part(user string) int {
	i, _ := strconv.Atoi(user[1:])
	return i % s.n
}

func (s *silentParts) PingPart(ctx context.Context, p int) error {
	n := s.inflight.Add(1)
	defer s.inflight.Add(-1)
	for m := s.most.Load(); n > m && !s.most.CompareAndSwap(m, n); m = s.most.Load() {
	}
	if s.silent.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func (s *silentParts) Beat(ctx context.Context, now int64, user, device string, active bool) (presence.Change, error) {
	if s.silent.Load() {
		return presence.Change{}, errStoreGone
	}
	return s.Store.Beat(ctx, now, user, device, active)
}

// The probe of the parts that are down is one round of pings bounded by
// StoreTimeout, not one StoreTimeout per part: a silent master holds a
// third of a Cluster's 256 shards, and Run's loop, which also renews the
// lease, would otherwise stop for minutes (the lease then runs out and
// other nodes take this node's devices over).
func TestProbeOfSilentPartsIsBounded(t *testing.T) {
	d := newMemDurable()
	ps := &silentParts{Store: memstore.New(memstore.Config{Rules: rules}), n: 40}
	const timeout = 50 * time.Millisecond
	tr, err := tracker.New(tracker.Config{Store: ps, Durable: d, Publisher: &recorder{}, Clock: clock.NewFake(start),
		Rules: rules, StoreTimeout: timeout, ProbeInterval: time.Hour, SweepInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ps.silent.Store(true)
	for i := range ps.n {
		if _, err := tr.Heartbeat(ctx, "u"+strconv.Itoa(i), "d", true); err != nil {
			t.Fatal(err)
		}
	}
	if st := tr.Stats(); st.PartsDown != ps.n || st.Down {
		t.Fatalf("stats %+v: want %d parts down, the store up", st, ps.n)
	}
	tr.RecoverParts(ctx)
	// One round: every silent part pinged at once (no timing assertion:
	// this machine is shared), not one after the other.
	if most := ps.most.Load(); most != int64(ps.n) {
		t.Errorf("a probe of %d silent parts had at most %d pings in flight at once, want all of them", ps.n, most)
	}
	ps.silent.Store(false)
	tr.RecoverParts(ctx)
	if st := tr.Stats(); st.PartsDown != 0 || st.Buffered != 0 {
		t.Errorf("stats %+v after the parts answered: want none down, nothing buffered", st)
	}
}

// A read of a user whose part is down does not go to the store: it is
// degraded (durable profile + buffer), as every read is while the whole
// store is down. Asking the store costs a StoreTimeout per read while the
// master is silent, and once it answers again (its replica promoted) but
// before the part is probed and replayed, the store's answer misses the
// beats in the buffer: a user who kept beating read offline.
func TestReadOfAPartDownIsDegraded(t *testing.T) {
	d := newMemDurable()
	ps := &partStore{s: memstore.New(memstore.Config{Rules: rules})}
	f := &fixture{t: t, ctx: context.Background(), clock: clock.NewFake(start), durable: d, pub: &recorder{}}
	tr, err := tracker.New(tracker.Config{Store: ps, Durable: d, Publisher: f.pub, Clock: f.clock, Rules: rules,
		ProbeInterval: time.Hour, SweepInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f.tr = tr
	f.beat("ann", "phone", true)
	f.beat("bob", "phone", true)
	ps.off[1].Store(true)
	for s := 10; s <= 50; s += 10 {
		f.at(time.Duration(s) * time.Second)
		f.beat("bob", "phone", true)
		f.beat("ann", "phone", true)
	}
	if st := tr.Stats(); st.PartsDown != 1 || st.Buffered != 1 {
		t.Fatalf("stats %+v: want part 1 down, bob buffered", st)
	}
	ps.off[1].Store(false) // back, not probed yet
	got := f.read("ann", "bob")
	if got[0].Status != presence.Online || got[1].Status != presence.Online {
		t.Errorf("ann %v, bob %v while bob's part is down (bob kept beating): want both online", got[0].Status, got[1].Status)
	}
	if f.read("bob")[0].Status != presence.Online {
		t.Errorf("bob alone reads offline while his part is down")
	}
}
