package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/tracker"
)

var leaseRules = presence.Rules{TTL: 30 * time.Second, IdleAfter: 5 * time.Minute, CloseGrace: 5 * time.Second}

const (
	lTTL  = int64(30_000)
	lIdle = int64(300_000)
)

func leaseStore(t *testing.T) *redisstore.Store {
	t.Helper()
	return newStore(t, client(t), redisstore.Config{Rules: leaseRules, EvictAfter: time.Hour})
}

func load(t *testing.T, s *redisstore.Store, now int64, users ...string) {
	t.Helper()
	for _, u := range users {
		if err := s.Load(context.Background(), now, &presence.Profile{UserID: u}); err != nil {
			t.Fatal(err)
		}
	}
}

func get(t *testing.T, s *redisstore.Store, now int64, user string) presence.Snapshot {
	t.Helper()
	var out [1]presence.Snapshot
	if err := s.Get(context.Background(), now, []string{user}, out[:]); err != nil {
		t.Fatal(err)
	}
	return out[0]
}

func mustClaim(t *testing.T, s *redisstore.Store, now int64, lease uint64, user, dev string, lb, la int64) presence.Change {
	t.Helper()
	ch, err := s.Claim(context.Background(), now, lease, user, tracker.OwnedDevice{ID: dev, LastBeat: lb, LastActive: la})
	if err != nil {
		t.Fatalf("claim %s/%s by %d: %v", user, dev, lease, err)
	}
	return ch
}

func touch1(s *redisstore.Store, now int64, lease uint64, user string, devs []tracker.OwnedDevice) (presence.Change, []string, error) {
	ts := []tracker.Touch{{User: user, Devices: devs}}
	s.Touch(context.Background(), now, lease, ts)
	return ts[0].Change, ts[0].Lost, ts[0].Err
}

func expireAll(t *testing.T, s *redisstore.Store, now int64) []presence.Change {
	t.Helper()
	out, err := s.Expire(context.Background(), now, 10_000, nil)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// An owned device lives until its owner says otherwise: no sweep ends
// it, however late; the user still turns away idle_after after the
// activity the owner last reported, unless a touch tells of newer.
func TestClaimedDeviceLivesUntilReleased(t *testing.T) {
	s := leaseStore(t)
	ctx := context.Background()
	load(t, s, 1000, "alice", "bob")
	ch := mustClaim(t, s, 1000, 7, "alice", "phone", 1000, 1000)
	if !ch.Changed || ch.Event.Status != presence.Online || ch.Event.Prev != presence.Offline {
		t.Fatalf("claim: %+v, want offline → online", ch)
	}
	if _, err := s.Claim(ctx, 1000, 7, "nobody", tracker.OwnedDevice{ID: "x", LastBeat: 1000}); !errors.Is(err, tracker.ErrNotLoaded) {
		t.Fatalf("claim of a user not loaded: %v", err)
	}
	// Far past the ttl: still online, one device.
	if got := expireAll(t, s, 1000+5*lTTL); len(got) != 0 {
		t.Fatalf("sweep ended an owned device: %+v", got)
	}
	if g := get(t, s, 1000+5*lTTL, "alice"); g.Status != presence.Online || g.Devices != 1 {
		t.Fatalf("read: %+v", g)
	}
	// Touch with newer activity before the idle time: no away.
	if _, lost, err := touch1(s, 200_000, 7, "alice", []tracker.OwnedDevice{{ID: "phone", LastBeat: 199_000, LastActive: 199_000}}); err != nil || len(lost) != 0 {
		t.Fatalf("touch: lost %v, %v", lost, err)
	}
	if got := expireAll(t, s, 1000+lIdle); len(got) != 0 {
		t.Fatalf("away after a touch with newer activity: %+v", got)
	}
	// A user present through an owned device is last seen at the read.
	if g := get(t, s, 1000+lIdle, "alice"); g.LastSeen != 1000+lIdle || g.PubLastSeen != 1000+lIdle {
		t.Errorf("last_seen read at %d: %+v, want the read's time", 1000+lIdle, g)
	}
	// Redis keeps no idle deadline of an owned device: its owner touches
	// the user when the activity it knows turns idle.
	if got := expireAll(t, s, 199_000+lIdle); len(got) != 0 {
		t.Fatalf("sweep at the idle time of an owned device: %+v", got)
	}
	ch, _, err := touch1(s, 199_000+lIdle, 7, "alice", []tracker.OwnedDevice{{ID: "phone", LastBeat: 300_000, LastActive: 199_000}})
	if err != nil || !ch.Changed || ch.Event.Status != presence.Away {
		t.Fatalf("touch idle_after the touched activity: %+v, %v; want away", ch, err)
	}
	// A touch of newer activity brings her back.
	ch, _, err = touch1(s, 600_000, 7, "alice", []tracker.OwnedDevice{{ID: "phone", LastBeat: 600_000, LastActive: 600_000}})
	if err != nil || !ch.Changed || ch.Event.Status != presence.Online {
		t.Fatalf("touch of an away user who is active again: %+v, %v", ch, err)
	}
	// A heartbeat through another path, or a disconnect of another
	// socket, leaves the device owned.
	if _, err := s.Beat(ctx, 601_000, "alice", "phone", true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Disconnect(ctx, 601_500, "alice", "phone", 601_000); err != nil {
		t.Fatal(err)
	}
	if got := expireAll(t, s, 601_500+5*lTTL); len(got) != 0 {
		t.Fatalf("an owned device ended after a plain beat or a disconnect: %+v", got)
	}
	u, _, _, err := s.Debug(ctx, "alice")
	if err != nil || len(u.Devices) != 1 || u.Devices[0].Owner != 7 {
		t.Fatalf("debug: %+v, %v", u, err)
	}
	// Touch of a user the store does not hold.
	if _, lost, err := touch1(s, 1000, 7, "nobody", []tracker.OwnedDevice{{ID: "x"}}); !errors.Is(err, tracker.ErrNotLoaded) || len(lost) != 1 {
		t.Fatalf("touch of a user not held: lost %v, %v", lost, err)
	}
}

// A release ends the device with its last beat as last_seen (a bye: now);
// a device another owner holds is left alone and reported lost.
func TestReleaseEndsOnlyTheOwnersDevices(t *testing.T) {
	s := leaseStore(t)
	ctx := context.Background()
	load(t, s, 1000, "alice", "bob")
	mustClaim(t, s, 1000, 7, "alice", "phone", 1000, 1000)
	mustClaim(t, s, 1000, 8, "alice", "pc", 1000, 1000)
	ch, lost, err := s.Release(ctx, 40_000, 7, "alice", []tracker.OwnedDevice{{ID: "phone", LastBeat: 9000, LastActive: 9000}, {ID: "pc", LastBeat: 9000}}, false)
	if err != nil || ch.Changed || len(lost) != 1 || lost[0] != "pc" {
		t.Fatalf("release by 7 of phone and pc: %+v, lost %v, %v; want no change, pc lost", ch, lost, err)
	}
	ch, lost, err = s.Release(ctx, 41_000, 8, "alice", []tracker.OwnedDevice{{ID: "pc", LastBeat: 12_000, LastActive: 5000}}, false)
	if err != nil || len(lost) != 0 || !ch.Changed || ch.Event.Status != presence.Offline || ch.Event.LastSeen != 12_000 {
		t.Fatalf("release of the last device: %+v, lost %v, %v; want offline, last seen 12000", ch, lost, err)
	}
	mustClaim(t, s, 50_000, 7, "bob", "phone", 50_000, 50_000)
	ch, _, err = s.Release(ctx, 60_000, 7, "bob", []tracker.OwnedDevice{{ID: "phone", LastBeat: 55_000, LastActive: 55_000}}, true)
	if err != nil || !ch.Changed || ch.Event.LastSeen != 60_000 {
		t.Fatalf("bye: %+v, %v; want offline, last seen at the bye (60000)", ch, err)
	}
}

// A device that moved to another node and that the first owner let go is
// the new node's; the first owner's late claim (its last beat is older
// than the move) is refused.
func TestStaleClaimIsRefused(t *testing.T) {
	s := leaseStore(t)
	load(t, s, 1000, "alice")
	ctx := context.Background()
	mustClaim(t, s, 1000, 7, "alice", "phone", 1000, 1000)
	mustClaim(t, s, 3000, 8, "alice", "phone", 3000, 3000) // the socket moved to 8; 7 holds it until it lets go
	if _, lost, err := s.Release(ctx, 3500, 7, "alice", []tracker.OwnedDevice{{ID: "phone", LastBeat: 2000, LastActive: 2000}}, false); err != nil || len(lost) != 0 {
		t.Fatalf("7 lets go: lost %v, %v", lost, err)
	}
	_, err := s.Claim(ctx, 4000, 7, "alice", tracker.OwnedDevice{ID: "phone", LastBeat: 2000, LastActive: 2000})
	if !errors.Is(err, tracker.ErrClaimStale) {
		t.Fatalf("late claim by the old owner: %v, want ErrClaimStale", err)
	}
	// With a beat newer than the move, the old owner's socket is a live
	// one: it holds the device again, with 8.
	mustClaim(t, s, 5000, 7, "alice", "phone", 5000, 5000)
	u, _, _, _ := s.Debug(ctx, "alice")
	if len(u.Devices) != 1 || u.Devices[0].Owner != 8 {
		t.Fatalf("devices: %+v", u.Devices)
	}
	if _, lost, err := s.Release(ctx, 5500, 8, "alice", []tracker.OwnedDevice{{ID: "phone", LastBeat: 5000, LastActive: 5000}}, false); err != nil || len(lost) != 0 {
		t.Fatalf("8 lets go: lost %v, %v", lost, err)
	}
	if u, _, _, _ = s.Debug(ctx, "alice"); len(u.Devices) != 1 || u.Devices[0].Owner != 7 {
		t.Fatalf("after 8 let go, 7 should hold the device alone: %+v", u.Devices)
	}
	// Too many devices.
	for i := range presence.DefaultMaxDevices - 1 {
		mustClaim(t, s, 6000, 7, "alice", fmt.Sprint("d", i), 6000, 6000)
	}
	if _, err := s.Claim(context.Background(), 6000, 7, "alice", tracker.OwnedDevice{ID: "one-more", LastBeat: 6000}); !errors.Is(err, presence.ErrTooManyDevices) {
		t.Fatalf("claim of one device too many: %v", err)
	}
}

// A lease that ran out is taken over once, however many nodes try at the
// same moment: every device it owned lives a ttl from the lease's last
// renewal, with the durable last_seen if it is newer, and each departure
// is returned to exactly one caller.
func TestTakeOverHappensOnce(t *testing.T) {
	s := leaseStore(t)
	ctx := context.Background()
	var users []string
	for i := range 40 {
		u := fmt.Sprint("u", i)
		users = append(users, u)
		load(t, s, 1000, u)
		mustClaim(t, s, 1000, 7, u, "phone", 1000, 1000)
	}
	load(t, s, 1000, "late")
	mustClaim(t, s, 1000, 7, "late", "phone", 1000, 1000)
	mustClaim(t, s, 1000, 9, "late", "pc", 1000, 1000) // another node's device: untouched
	const renewed = 5000
	lastSeen := func(_ context.Context, us []string) (map[string]int64, error) {
		m := map[string]int64{}
		for _, u := range us {
			m[u] = 4000
		}
		return m, nil
	}
	now := int64(renewed + lTTL) // every takeover is due at once
	var mu sync.Mutex
	got := map[string]int{}
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			out, err := s.TakeOver(ctx, now, 7, renewed, lastSeen, nil)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, c := range out {
				got[c.Event.UserID]++
				if c.Event.Status != presence.Offline || c.Event.LastSeen != 4000 {
					t.Errorf("takeover of %s: %+v, want offline at the durable last_seen", c.Event.UserID, c.Event)
				}
			}
		})
	}
	wg.Wait()
	for _, u := range users {
		if got[u] != 1 {
			t.Errorf("%s announced offline %d times, want once", u, got[u])
		}
	}
	if got["late"] != 0 {
		t.Errorf("a user with a device of another node went offline")
	}
	if g := get(t, s, now, "late"); g.Status != presence.Online || g.Devices != 1 {
		t.Errorf("late after the takeover: %+v, want online with node 9's device", g)
	}
	// A takeover that is not due yet: the device lives a ttl from the
	// renewal, and the sweep ends it then.
	load(t, s, 1000, "v")
	mustClaim(t, s, 1000, 10, "v", "phone", 1000, 1000)
	out, err := s.TakeOver(ctx, 6000, 10, renewed, nil, nil)
	if err != nil || len(out) != 0 {
		t.Fatalf("takeover before the ttl: %+v, %v", out, err)
	}
	if got := expireAll(t, s, renewed+lTTL-1); len(got) != 0 {
		t.Fatalf("sweep before renewal+ttl: %+v", got)
	}
	if got := expireAll(t, s, renewed+lTTL); len(got) != 1 || got[0].Event.UserID != "v" {
		t.Fatalf("sweep at renewal+ttl: %+v", got)
	}
}

// A node that stops hands its devices off with their real last beats:
// each lives its ttl from there, as after missed beats.
func TestHandOff(t *testing.T) {
	s := leaseStore(t)
	ctx := context.Background()
	load(t, s, 1000, "alice")
	mustClaim(t, s, 1000, 7, "alice", "phone", 1000, 1000)
	ch, lost, err := s.HandOff(ctx, 5000, 7, "alice", []tracker.OwnedDevice{{ID: "phone", LastBeat: 4000, LastActive: 3000}})
	if err != nil || ch.Changed || len(lost) != 0 {
		t.Fatalf("hand off: %+v, lost %v, %v", ch, lost, err)
	}
	if got := expireAll(t, s, 4000+lTTL-1); len(got) != 0 {
		t.Fatalf("sweep before the ttl: %+v", got)
	}
	got := expireAll(t, s, 4000+lTTL)
	if len(got) != 1 || got[0].Event.LastSeen != 4000 {
		t.Fatalf("sweep at the ttl: %+v, want offline at the last beat", got)
	}
}

func TestLeases(t *testing.T) {
	s := leaseStore(t)
	ctx := context.Background()
	for _, l := range []uint64{7, 8} {
		if err := s.AcquireLease(ctx, l, 1000); err != nil {
			t.Fatal(err)
		}
	}
	all, err := s.RenewLease(ctx, 7, 2000, nil)
	if err != nil || len(all) != 2 {
		t.Fatalf("renew: %+v, %v", all, err)
	}
	for _, l := range all {
		if want := map[uint64]int64{7: 2000, 8: 1000}[l.ID]; l.Renewed != want || l.Taken {
			t.Errorf("lease %d: %+v, want renewed at %d", l.ID, l, want)
		}
	}
	if ok, err := s.TakeLease(ctx, 8, 999, 3000); err != nil || ok {
		t.Fatalf("take with a stale view: %v, %v; want refused", ok, err)
	}
	if ok, err := s.TakeLease(ctx, 8, 1000, 3000); err != nil || !ok {
		t.Fatalf("take: %v, %v", ok, err)
	}
	if ok, _ := s.TakeLease(ctx, 8, 1000, 3100); ok {
		t.Fatal("a second taker marked the lease again")
	}
	if _, err := s.RenewLease(ctx, 8, 4000, nil); !errors.Is(err, tracker.ErrLeaseLost) {
		t.Fatalf("renew of a lease taken over: %v", err)
	}
	all, _ = s.RenewLease(ctx, 7, 4000, nil)
	for _, l := range all {
		if l.ID == 8 && (!l.Taken || l.Renewed != 1000 || l.TakenAt != 3000) {
			t.Errorf("lease 8 as seen: %+v", l)
		}
	}
	if err := s.EndLease(ctx, 8); err != nil {
		t.Fatal(err)
	}
	if all, _ := s.RenewLease(ctx, 7, 5000, nil); len(all) != 1 {
		t.Errorf("leases after the end of 8: %+v", all)
	}
}

// Touches go many users to a call: the common one (online, and staying
// online by the owner's devices) only moves times; the others (away →
// online, online → away at the idle time, a device of another owner, a
// user not held) take the full path, in order.
func TestTouchBatch(t *testing.T) {
	s := leaseStore(t)
	ctx := context.Background()
	var users []string
	for i := range 300 {
		u := fmt.Sprint("t", i)
		users = append(users, u)
		load(t, s, 1000, u)
		mustClaim(t, s, 1000, 7, u, "phone", 1000, 1000)
	}
	mustClaim(t, s, 1000, 8, "t5", "pc", 1000, 1000) // t5 has another node's device too
	// t7 turns away, t9 is evicted from Redis (gone).
	if got := expireAll(t, s, 1000+lIdle-1); len(got) != 0 {
		t.Fatalf("sweep before the idle time: %+v", got)
	}
	var ts []tracker.Touch
	for _, u := range users {
		ts = append(ts, tracker.Touch{User: u, Devices: []tracker.OwnedDevice{{ID: "phone", LastBeat: 250_000, LastActive: 250_000}}})
	}
	ts[3].Devices = append(ts[3].Devices, tracker.OwnedDevice{ID: "gone", LastBeat: 1, LastActive: 1})
	ts = append(ts, tracker.Touch{User: "nobody", Devices: []tracker.OwnedDevice{{ID: "x"}}})
	s.Touch(ctx, 260_000, 7, ts)
	for i, tc := range ts {
		switch {
		case tc.User == "nobody":
			if !errors.Is(tc.Err, tracker.ErrNotLoaded) || len(tc.Lost) != 1 {
				t.Errorf("touch of a user not held: %+v", tc)
			}
		case i == 3:
			if tc.Err != nil || len(tc.Lost) != 1 || tc.Lost[0] != "gone" {
				t.Errorf("touch with a device not held: %+v", tc)
			}
		case tc.Err != nil || tc.Change.Changed || len(tc.Lost) != 0:
			t.Errorf("touch %d: %+v", i, tc)
		}
	}
	// Nobody turns away by a sweep; everyone does when the owner touches
	// them idle_after their activity.
	if got := expireAll(t, s, 250_000+lIdle); len(got) != 0 {
		t.Fatalf("sweep at the idle time of owned devices: %+v", got)
	}
	ts = ts[:0]
	for _, u := range users {
		ts = append(ts, tracker.Touch{User: u, Devices: []tracker.OwnedDevice{{ID: "phone", LastBeat: 250_000, LastActive: 250_000}}})
	}
	s.Touch(ctx, 250_000+lIdle, 7, ts)
	for _, tc := range ts {
		if tc.Err != nil || !tc.Change.Changed || tc.Change.Event.Status != presence.Away {
			t.Fatalf("touch at the idle time: %+v", tc)
		}
	}
	if g := get(t, s, 250_000+lIdle, "t1"); g.Status != presence.Away || g.LastSeen != 250_000+lIdle {
		t.Errorf("t1 after the touch: %+v", g)
	}
	// A touch of activity of away users brings them back (full path),
	// batched with fast ones.
	ts = ts[:0]
	for _, u := range users[:3] {
		ts = append(ts, tracker.Touch{User: u, Devices: []tracker.OwnedDevice{{ID: "phone", LastBeat: 600_000, LastActive: 600_000}}})
	}
	s.Touch(ctx, 600_000, 7, ts)
	for _, tc := range ts {
		if tc.Err != nil || !tc.Change.Changed || tc.Change.Event.Status != presence.Online {
			t.Errorf("touch of an away user active again: %+v", tc)
		}
	}
}

// An owner's release of a device that beat since through another path
// (an HTTP heartbeat with the same device id) leaves it to the rules from
// that beat instead of ending it.
func TestReleaseOfADeviceThatBeatElsewhere(t *testing.T) {
	s := leaseStore(t)
	ctx := context.Background()
	load(t, s, 1000, "alice")
	mustClaim(t, s, 1000, 7, "alice", "phone", 1000, presence.Forever)
	if _, err := s.Beat(ctx, 5000, "alice", "phone", true); err != nil {
		t.Fatal(err)
	}
	ch, lost, err := s.Release(ctx, 8000, 7, "alice", []tracker.OwnedDevice{{ID: "phone", LastBeat: 3000, LastActive: 3000}}, false)
	if err != nil || ch.Changed || len(lost) != 0 {
		t.Fatalf("release: %+v, lost %v, %v; want no change", ch, lost, err)
	}
	if g := get(t, s, 8000, "alice"); g.Status != presence.Online || g.Devices != 1 {
		t.Fatalf("after the release: %+v, want online by the HTTP beat", g)
	}
	if got := expireAll(t, s, 5000+lTTL-1); len(got) != 0 {
		t.Fatalf("sweep before the HTTP beat's ttl: %+v", got)
	}
	if got := expireAll(t, s, 5000+lTTL); len(got) != 1 || got[0].Event.Status != presence.Offline {
		t.Fatalf("sweep at the HTTP beat's ttl: %+v", got)
	}
}

// Two sockets of one device on two nodes (a browser tab duplicated with
// its session storage, its copy connected to another node): both nodes
// hold the device. It stays online while either does — the end of one
// hold (release, bye, hand-off, its lease taken over) leaves it to the
// other, idle only when no holder says it is active — and goes offline
// once, when the last hold ends.
func TestDuplicatedTabOnTwoNodes(t *testing.T) {
	s := leaseStore(t)
	ctx := context.Background()
	load(t, s, 1000, "ann", "bea", "cid")
	for _, u := range []string{"ann", "bea", "cid"} {
		mustClaim(t, s, 1000, 7, u, "tab", 1000, presence.Forever)
		mustClaim(t, s, 2000, 8, u, "tab", 2000, presence.Forever)
	}
	online := func(when string, now int64, u string) {
		t.Helper()
		if g := get(t, s, now, u); g.Status != presence.Online || g.Devices != 1 {
			t.Fatalf("%s: %s reads %+v, want online with one device", when, u, g)
		}
	}
	// ann: the first tab closes (its grace ran out on node 7), then the
	// second; each node's release is its own.
	ch, lost, err := s.Release(ctx, 10_000, 7, "ann", []tracker.OwnedDevice{{ID: "tab", LastBeat: 4000, LastActive: 4000}}, false)
	if err != nil || ch.Changed || len(lost) != 0 {
		t.Fatalf("release of one of two holds: %+v, lost %v, %v; want nothing visible", ch, lost, err)
	}
	online("one tab of two closed", 10_000, "ann")
	if got := expireAll(t, s, 10_000+5*lTTL); len(got) != 0 {
		t.Fatalf("the device still held by node 8 expired: %+v", got)
	}
	// Node 8 says the tab turned idle: node 7 no longer holds it, so it is idle.
	if ch, lost, err := touch1(s, 700_000, 8, "ann", []tracker.OwnedDevice{{ID: "tab", LastBeat: 700_000, LastActive: 300_000}}); err != nil || len(lost) != 0 || !ch.Changed || ch.Event.Status != presence.Away {
		t.Fatalf("idle touch by the last holder: %+v, lost %v, %v; want away", ch, lost, err)
	}
	ch, lost, err = s.Release(ctx, 710_000, 8, "ann", []tracker.OwnedDevice{{ID: "tab", LastBeat: 705_000, LastActive: 300_000}}, false)
	if err != nil || len(lost) != 0 || !ch.Changed || ch.Event.Status != presence.Offline {
		t.Fatalf("release of the last hold: %+v, lost %v, %v; want offline", ch, lost, err)
	}

	// bea: one holder turning idle does not make her idle while the other
	// holds her active; a bye in one tab ends only that tab's hold.
	if ch, lost, err := touch1(s, 400_000, 7, "bea", []tracker.OwnedDevice{{ID: "tab", LastBeat: 400_000, LastActive: 3000}}); err != nil || len(lost) != 0 || ch.Changed {
		t.Fatalf("idle touch by one of two holders: %+v, lost %v, %v; want nothing visible", ch, lost, err)
	}
	online("one of two tabs idle", 400_000, "bea")
	if ch, _, err := s.Release(ctx, 401_000, 8, "bea", []tracker.OwnedDevice{{ID: "tab", LastBeat: 401_000, LastActive: 401_000}}, true); err != nil || ch.Changed {
		t.Fatalf("bye in one of two tabs: %+v, %v; want nothing visible", ch, err)
	}
	online("bye in one of two tabs", 401_000, "bea")

	// cid: node 7 stops (hand-off) and node 8's lease is taken over
	// later: the device lives a ttl from node 8's last renewal, then
	// goes offline once.
	if ch, lost, err := s.HandOff(ctx, 20_000, 7, "cid", []tracker.OwnedDevice{{ID: "tab", LastBeat: 19_000, LastActive: 19_000}}); err != nil || ch.Changed || len(lost) != 0 {
		t.Fatalf("hand-off of one of two holds: %+v, lost %v, %v", ch, lost, err)
	}
	if got := expireAll(t, s, 19_000+2*lTTL); len(got) != 0 {
		t.Fatalf("expired while node 8 holds it: %+v", got)
	}
	online("node 7 stopped", 19_000+2*lTTL, "cid")
	if out, err := s.TakeOver(ctx, 200_000, 8, 100_000, nil, nil); err != nil {
		t.Fatal(err)
	} else if len(out) != 1 || out[0].Event.UserID != "cid" || out[0].Event.Status != presence.Offline {
		t.Fatalf("take-over of node 8's lease a ttl after its last renewal: %+v, want cid offline once", out)
	}
	got := expireAll(t, s, 300_000)
	for _, ch := range got {
		if ch.Event.UserID == "cid" {
			t.Fatalf("cid announced again after the take-over: %+v", got)
		}
	}
}

// The copy of a duplicated tab (the second holder, its beat later than
// any of the first's) closes first; the first tab then closes before it
// beat again. Its release carries a last beat older than the copy's: that
// is not a beat through another path, and the device ends with it, not a
// ttl after the copy's beat. last_seen is the later of the two.
func TestDuplicatedTabTheCopyClosesFirst(t *testing.T) {
	s := leaseStore(t)
	ctx := context.Background()
	load(t, s, 1000, "uma")
	mustClaim(t, s, 1000, 7, "uma", "tab", 1000, presence.Forever)
	mustClaim(t, s, 3000, 8, "uma", "tab", 3000, presence.Forever)
	if ch, lost, err := s.Release(ctx, 5000, 8, "uma", []tracker.OwnedDevice{{ID: "tab", LastBeat: 3500, LastActive: 3500}}, false); err != nil || ch.Changed || len(lost) != 0 {
		t.Fatalf("release of the copy's hold: %+v, lost %v, %v; want nothing visible", ch, lost, err)
	}
	ch, lost, err := s.Release(ctx, 6000, 7, "uma", []tracker.OwnedDevice{{ID: "tab", LastBeat: 2000, LastActive: 2000}}, false)
	if err != nil || len(lost) != 0 || !ch.Changed || ch.Event.Status != presence.Offline || ch.Event.LastSeen != 3500 {
		t.Fatalf("release of the last hold, its beat older than the copy's: %+v, lost %v, %v; want offline, last seen 3500", ch, lost, err)
	}
	if got := expireAll(t, s, 3500+lTTL); len(got) != 0 {
		t.Fatalf("announced again at the copy's ttl: %+v", got)
	}
}

// A lease whose devices are spread over more buckets than one takeover
// script reads (and more chunks than one round trip carries) is taken over
// whole, chunk by chunk, each departure announced once, its set gone; a
// second takeover finds nothing.
func TestTakeOverInChunks(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	prefix := testsvc.Unique(t) + ":"
	s, users := ownedCrowd(t, c, prefix, 11)
	buckets, err := c.Do(ctx, c.B().Scard().Key(prefix+"{0}ob:11").Build()).AsInt64()
	if err != nil || buckets < 65*16 {
		t.Fatalf("the lease's devices in %d buckets (%v): want more than 64 chunks of 16", buckets, err)
	}
	const renewed = 5000
	now := int64(renewed + lTTL)
	out, err := s.TakeOver(ctx, now, 11, renewed, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, ch := range out {
		got[ch.Event.UserID]++
	}
	for _, u := range users {
		if got[u] != 1 {
			t.Fatalf("%s announced offline %d times, want once (%d changes in all)", u, got[u], len(out))
		}
	}
	if n, err := c.Do(ctx, c.B().Exists().Key(prefix+"{0}ob:11").Build()).AsInt64(); err != nil || n != 0 {
		t.Errorf("the lease's set of buckets is still there: %d %v", n, err)
	}
	if again, err := s.TakeOver(ctx, now, 11, renewed, nil, nil); err != nil || len(again) != 0 {
		t.Errorf("second takeover: %d changes, %v; want none", len(again), err)
	}
}

// A takeover that runs short of time stops between two rounds of chunks
// with tracker.ErrTakeOverLeft, having returned the departures of what
// it took over; the next call takes over the rest; each departure is
// returned once in all.
func TestTakeOverLeftForTheNextCall(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	s, users := ownedCrowd(t, c, testsvc.Unique(t)+":", 12)
	const renewed = 5000
	now := int64(renewed + lTTL)
	slowDurable := func(ctx context.Context, _ []string) (map[string]int64, error) {
		select { // PostgreSQL answering slowly
		case <-time.After(200 * time.Millisecond):
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	got := map[string]int{}
	left := 0
	for call := 0; ; call++ {
		if call == 40 {
			t.Fatalf("not taken over in 40 calls (%d returned ErrTakeOverLeft)", left)
		}
		cctx, cancel := context.WithTimeout(ctx, 600*time.Millisecond)
		out, err := s.TakeOver(cctx, now, 12, renewed, slowDurable, nil)
		cancel()
		for _, ch := range out {
			got[ch.Event.UserID]++
		}
		if errors.Is(err, tracker.ErrTakeOverLeft) {
			left++
			continue
		}
		if err != nil {
			t.Fatalf("call %d: %v", call, err)
		}
		break
	}
	if left == 0 {
		t.Errorf("a takeover of 2000 users in rounds of 200 ms within 600 ms never stopped")
	}
	for _, u := range users {
		if got[u] != 1 {
			t.Fatalf("%s announced offline %d times, want once", u, got[u])
		}
	}
}

// ownedCrowd is a store of one shard of 4,096 buckets under prefix with
// 2,000 users, each with a device lease claimed at 1000: the lease holds
// devices in far more buckets than one round of takeover scripts reads.
func ownedCrowd(t *testing.T, c rueidis.Client, prefix string, lease uint64) (*redisstore.Store, []string) {
	t.Helper()
	s := newStore(t, c, redisstore.Config{Rules: leaseRules, Prefix: prefix, Shards: 1, Buckets: 4096, EvictAfter: time.Hour})
	users := make([]string, 2000)
	for i := range users {
		users[i] = fmt.Sprint("w", i)
	}
	load(t, s, 1000, users...)
	for _, u := range users {
		mustClaim(t, s, 1000, lease, u, "tab", 1000, presence.Forever)
	}
	return s, users
}
