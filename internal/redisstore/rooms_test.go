package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/storetest"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/tracker"
)

// TestRoomsConformanceCluster runs the rooms suite on a Redis Cluster of
// three masters: a user's side and a room's side are in two slots, most
// often on two masters.
func TestRoomsConformanceCluster(t *testing.T) {
	t.Parallel()
	cl := testsvc.RedisCluster(t, 3)
	c := dial(t, cl.URL)
	storetest.RunRooms(t, func(t *testing.T, r presence.Rules, rr presence.RoomRules) tracker.Store {
		return newStore(t, c, redisstore.Config{Rules: r, RoomRules: rr, EvictAfter: 1000 * time.Hour})
	})
}

func roomEvents(chs []presence.Change) []string {
	var out []string
	for _, ch := range chs {
		for _, e := range ch.Rooms {
			out = append(out, fmt.Sprintf("%s %s %s %s %d", e.Kind, e.Room, e.UserID, e.Reason, e.Count))
		}
	}
	slices.Sort(out)
	return out
}

func mustJoin(t *testing.T, s *redisstore.Store, now int64, user, dev, room string) presence.RoomEvent {
	t.Helper()
	ev, _, err := s.Join(context.Background(), now, user, dev, room)
	if err != nil {
		t.Fatalf("join %s/%s %s: %v", user, dev, room, err)
	}
	return ev
}

func roomCount(t *testing.T, s *redisstore.Store, room string) int {
	t.Helper()
	n, err := s.RoomCounts(context.Background(), []string{room}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return n[0]
}

// A device a node holds leaves its rooms when its owner releases it, and
// when its owner's lease is taken over: each member once, however many
// nodes take the lease over at the same moment.
func TestRoomsOfOwnedDevices(t *testing.T) {
	s := leaseStore(t)
	ctx := context.Background()
	load(t, s, 1000, "alice")
	mustClaim(t, s, 1000, 7, "alice", "phone", 1000, 1000)
	mustJoin(t, s, 1000, "alice", "phone", "doc")
	ch, _, err := s.Release(ctx, 2000, 7, "alice", []tracker.OwnedDevice{{ID: "phone", LastBeat: 1500, LastActive: 1500}}, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := roomEvents([]presence.Change{ch}); !slices.Equal(got, []string{"leave doc alice ended 0"}) {
		t.Fatalf("release: %q", got)
	}
	var users []string
	for i := range 30 {
		u := fmt.Sprint("u", i)
		users = append(users, u)
		load(t, s, 1000, u)
		mustClaim(t, s, 1000, 9, u, "phone", 1000, 1000)
		mustJoin(t, s, 1000, u, "phone", "call")
		mustJoin(t, s, 1000, u, "phone", fmt.Sprint("team-", i%3))
	}
	if n := roomCount(t, s, "call"); n != 30 {
		t.Fatalf("call: %d members", n)
	}
	const renewed = 5000
	now := int64(renewed + lTTL)
	var mu sync.Mutex
	var all []presence.Change
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			out, err := s.TakeOver(ctx, now, 9, renewed, nil, nil)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			all = append(all, out...)
			mu.Unlock()
		})
	}
	wg.Wait()
	all = append(all, expireAll(t, s, now+5000)...)
	left := map[string]int{}
	for _, ch := range all {
		for _, e := range ch.Rooms {
			if e.Kind != presence.RoomLeave || e.Reason != presence.ReasonEnded {
				t.Errorf("takeover: %+v", e)
			}
			left[e.UserID+" "+e.Room]++
		}
	}
	for i, u := range users {
		for _, room := range []string{"call", fmt.Sprint("team-", i%3)} {
			if left[u+" "+room] != 1 {
				t.Errorf("%s left %s %d times, want once", u, room, left[u+" "+room])
			}
		}
	}
	for _, room := range []string{"call", "team-0", "team-1", "team-2"} {
		if n := roomCount(t, s, room); n != 0 {
			t.Errorf("%s after the takeover: %d members", room, n)
		}
	}
}

// pendingLeave makes alice's laptop end inside a beat of her phone (a
// beat leaves the room ops it makes to the sweep) and returns when.
func pendingLeave(t *testing.T, s *redisstore.Store) int64 {
	t.Helper()
	ctx := context.Background()
	load(t, s, 1000, "alice")
	for _, d := range []string{"phone", "laptop"} {
		if _, err := s.Beat(ctx, 1000, "alice", d, true); err != nil {
			t.Fatal(err)
		}
	}
	mustJoin(t, s, 1000, "alice", "laptop", "doc")
	now := 1000 + lTTL + 1
	if _, err := s.Beat(ctx, now, "alice", "phone", true); err != nil {
		t.Fatal(err)
	}
	if n := roomCount(t, s, "doc"); n != 1 {
		t.Fatalf("doc before its ops are applied: %d", n)
	}
	return now
}

// pendingClaim is pendingLeave, and the ops claimed by a node that is
// about to apply them.
func pendingClaim(t *testing.T, s *redisstore.Store) (int64, *redisstore.RoomClaim) {
	t.Helper()
	now := pendingLeave(t, s)
	rc, err := s.TakeRoomOps(context.Background(), now, "alice")
	if err != nil || rc == nil {
		t.Fatalf("take: %v %v", rc, err)
	}
	return now, rc
}

// A node that claimed a user's room ops and died before applying them:
// nobody applies them while its claim lasts, the sweep does after.
func TestRoomOpsOfANodeThatDied(t *testing.T) {
	s := leaseStore(t)
	now, _ := pendingClaim(t, s) // and the node dies
	if got := roomEvents(expireAll(t, s, now+1000)); len(got) != 0 {
		t.Fatalf("a sweep while the claim lasts: %q", got)
	}
	got := roomEvents(expireAll(t, s, now+3001))
	if !slices.Equal(got, []string{"leave doc alice ended 0"}) {
		t.Fatalf("the sweep after the claim: %q", got)
	}
	if got := roomEvents(expireAll(t, s, now+10_000)); len(got) != 0 {
		t.Fatalf("a later sweep: %q", got)
	}
}

// A node that applied the ops and died before acknowledging them: the
// sweep applies them again, which moves no count and tells nothing twice.
func TestRoomOpsAppliedNotAcknowledged(t *testing.T) {
	s := leaseStore(t)
	ctx := context.Background()
	now, rc := pendingClaim(t, s)
	evs, refused, err := s.ApplyRoomOpsNoAck(ctx, now+10, rc)
	if err != nil || refused != 0 || len(evs) != 1 || evs[0].Count != 0 {
		t.Fatalf("apply: %+v refused %d, %v", evs, refused, err)
	}
	if got := roomEvents(expireAll(t, s, now+3001)); len(got) != 0 {
		t.Fatalf("ops applied twice: %q", got)
	}
	if n := roomCount(t, s, "doc"); n != 0 {
		t.Fatalf("doc: %d members", n)
	}
	if rc, err := s.TakeRoomOps(ctx, now+20_000, "alice"); rc != nil || err != nil {
		t.Fatalf("ops left after the sweep: %+v %v", rc, err)
	}
}

// A node that stalled past its claim writes nothing: the room refuses
// its ops, and the node that took them over applies them once.
func TestStalledRoomApplierIsFenced(t *testing.T) {
	s := leaseStore(t)
	ctx := context.Background()
	now, rc := pendingClaim(t, s)
	evs, refused, err := s.ApplyRoomOpsNoAck(ctx, now+2001, rc)
	if err != nil || refused != 1 || len(evs) != 0 {
		t.Fatalf("a stalled apply: %+v refused %d, %v", evs, refused, err)
	}
	if n := roomCount(t, s, "doc"); n != 1 {
		t.Fatalf("doc after a refused apply: %d", n)
	}
	got := roomEvents(expireAll(t, s, now+3001))
	if !slices.Equal(got, []string{"leave doc alice ended 0"}) {
		t.Fatalf("the sweep after the claim: %q", got)
	}
}

// After the store lost its data the tracker raises the floors to a new
// epoch: a room's next versions are above it, so no watcher takes them for
// events it has seen.
func TestRoomVersionsAboveARaisedFloor(t *testing.T) {
	s := leaseStore(t)
	ctx := context.Background()
	load(t, s, 1000, "alice")
	if _, err := s.Beat(ctx, 1000, "alice", "phone", true); err != nil {
		t.Fatal(err)
	}
	if ev := mustJoin(t, s, 1000, "alice", "phone", "doc"); ev.Version == 0 || ev.Version > 1<<40 {
		t.Fatalf("first join: version %d", ev.Version)
	}
	const floor = uint64(9) << 40
	if err := s.RaiseFloor(ctx, floor); err != nil {
		t.Fatal(err)
	}
	if ev := mustJoin(t, s, 1000, "alice", "phone", "other"); ev.Version <= floor {
		t.Fatalf("a join after the raise: version %d, want above %d", ev.Version, floor)
	}
}
