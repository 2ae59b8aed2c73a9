package owned

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
)

var rules = presence.Rules{TTL: 30 * time.Second, IdleAfter: 5 * time.Minute, CloseGrace: 5 * time.Second}

const (
	ttl   = int64(30_000)
	idle  = int64(300_000)
	grace = int64(5_000)
)

func newTable() *Table {
	return New(Config{Rules: rules, Retry: time.Second})
}

// claim beats a new device and reports its claim done.
func claim(t *testing.T, tb *Table, now int64, user, dev string) {
	t.Helper()
	if need := tb.Beat(now, user, dev, true, false); need != NeedClaim {
		t.Fatalf("first beat of %s/%s: need %d, want a claim", user, dev, need)
	}
	if got := tb.Pending(user, NeedClaim, nil); len(got) != 1 || got[0].ID != dev || !got[0].Active {
		t.Fatalf("pending claim of %s: %+v", user, got)
	}
	tb.Done(now, user, Result{})
}

func due(tb *Table, now int64) []Work { return tb.Due(now, nil) }

func TestBeatOfAClaimedDeviceNeedsNothing(t *testing.T) {
	tb := newTable()
	claim(t, tb, 1000, "alice", "phone")
	for now := int64(2000); now < 200_000; now += 15_000 {
		if need := tb.Beat(now, "alice", "phone", true, false); need != NeedNothing {
			t.Fatalf("beat at %d: need %d, want nothing", now, need)
		}
		if w := due(tb, now); len(w) != 0 {
			t.Fatalf("work due at %d: %+v", now, w)
		}
	}
	allocs := testing.AllocsPerRun(1000, func() { tb.Beat(200_000, "alice", "phone", true, false) })
	if allocs != 0 {
		t.Errorf("a beat that needs nothing allocates %v times", allocs)
	}
}

func TestDeviceThatStopsBeatingIsReleasedAtItsTTL(t *testing.T) {
	tb := newTable()
	claim(t, tb, 1000, "alice", "phone")
	tb.Beat(4000, "alice", "phone", false, false)
	if w := due(tb, 4000+ttl-1); len(w) != 0 {
		t.Fatalf("work before the ttl ran out: %+v", w)
	}
	w := due(tb, 4000+ttl)
	if len(w) != 1 || len(w[0].Release) != 1 || w[0].Release[0].LastBeat != 4000 || w[0].Release[0].LastActive != 1000 {
		t.Fatalf("work at the end of the ttl: %+v, want the release of phone, last beat 4000, active 1000", w)
	}
	tb.Done(4000+ttl, "alice", Result{})
	if n := tb.Len(); n != 0 {
		t.Errorf("%d devices held after the release", n)
	}
	if got := tb.Devices(4000+ttl, "alice", nil); len(got) != 0 {
		t.Errorf("devices after the release: %+v", got)
	}
}

func TestCloseShortensToTheGraceAndABeatReopens(t *testing.T) {
	tb := newTable()
	claim(t, tb, 1000, "alice", "phone")
	if !tb.Close(2000, "alice", "phone", 1000) {
		t.Fatal("Close: the table does not hold the device")
	}
	if w := due(tb, 2000+grace-1); len(w) != 0 {
		t.Fatalf("work within the grace: %+v", w)
	}
	// A reconnect within the grace: nothing is released.
	tb.Beat(2000+grace-500, "alice", "phone", true, false)
	if w := due(tb, 2000+grace+1000); len(w) != 0 {
		t.Fatalf("work after a reconnect within the grace: %+v", w)
	}
	// A close whose socket made an older beat than the device's last one
	// (the device has another socket) changes nothing.
	tb.Close(9000, "alice", "phone", 4000)
	if w := due(tb, 9000+grace+1); len(w) != 0 {
		t.Fatalf("work after the close of an older socket: %+v", w)
	}
	last := 2000 + grace - 500
	tb.Close(10_000, "alice", "phone", last)
	w := due(tb, 10_000+grace)
	if len(w) != 1 || len(w[0].Release) != 1 || w[0].Release[0].LastBeat != last {
		t.Fatalf("work at the end of the grace: %+v", w)
	}
	if tb.Close(1, "bob", "x", 0) {
		t.Error("Close of an unknown device reports it held")
	}
}

func TestActiveUserCostsTheStoreNothing(t *testing.T) {
	tb := newTable()
	claim(t, tb, 1000, "alice", "phone")
	// Active for three idle periods, beating every 15 s: the store holds
	// her device active, and nothing is due.
	for now := int64(2000); now < 1000+3*idle; now += 500 {
		if now%15_000 == 0 {
			if need := tb.Beat(now, "alice", "phone", true, false); need != NeedNothing {
				t.Fatalf("beat at %d: need %d", now, need)
			}
		}
		if w := due(tb, now); len(w) != 0 {
			t.Fatalf("work at %d: %+v", now, w)
		}
	}
}

func TestActiveBeatOfAUserTheStoreShowsIdleNeedsATouchNow(t *testing.T) {
	tb := newTable()
	if tb.Beat(1000, "alice", "phone", false, false) != NeedClaim {
		t.Fatal("first beat needs a claim")
	}
	tb.Done(1000, "alice", Result{})
	// Her claim carried no activity: the store shows her away.
	if need := tb.Beat(2000, "alice", "phone", false, false); need != NeedNothing {
		t.Fatalf("background beat: need %d", need)
	}
	if need := tb.Beat(3000, "alice", "phone", true, false); need != NeedTouch {
		t.Fatalf("active beat of a user the store shows away: need %d, want a touch", need)
	}
	got := tb.Pending("alice", NeedTouch, nil)
	if len(got) != 1 || got[0].LastActive != 3000 || !got[0].Active {
		t.Fatalf("pending touch: %+v", got)
	}
	tb.Done(3000, "alice", Result{})
	if need := tb.Beat(4000, "alice", "phone", true, false); need != NeedNothing {
		t.Fatalf("active beat after the touch: need %d", need)
	}
}

func TestFailedWorkIsRetriedAfterTheRetryTime(t *testing.T) {
	tb := newTable()
	if tb.Beat(1000, "alice", "phone", true, false) != NeedClaim {
		t.Fatal("want a claim")
	}
	tb.Done(1000, "alice", Result{Failed: true}) // the store is down
	// Beats during the back-off need nothing; the device is alive here.
	if need := tb.Beat(1500, "alice", "phone", true, false); need != NeedNothing {
		t.Fatalf("beat during the back-off: need %d", need)
	}
	if got := tb.Devices(1500, "alice", nil); len(got) != 1 {
		t.Fatalf("devices during the back-off: %+v", got)
	}
	if w := due(tb, 1999); len(w) != 0 {
		t.Fatalf("work before the retry: %+v", w)
	}
	w := due(tb, 2000)
	if len(w) != 1 || len(w[0].Claim) != 1 || w[0].Claim[0].LastBeat != 1500 {
		t.Fatalf("work at the retry: %+v, want the claim with the latest beat", w)
	}
	tb.Done(2000, "alice", Result{})
	if need := tb.Beat(3000, "alice", "phone", true, false); need != NeedNothing {
		t.Fatalf("beat after the claim: need %d", need)
	}
}

// A device whose claim was sent may be in the store even if no answer
// came (a reply lost): its end is a release. One whose claim was never
// sent (beaten while its user's work waited for a retry) ends here
// without a word to the store.
func TestDeviceThatDiesUnclaimed(t *testing.T) {
	tb := newTable()
	tb.Beat(1000, "alice", "phone", true, false)
	tb.Done(1000, "alice", Result{Failed: true})
	tb.Beat(1100, "alice", "tab", true, false)
	// The store is down past the ttl: the caller sends nothing.
	for now := int64(2000); now <= 1000+ttl; now += 1000 {
		for _, w := range due(tb, now) {
			tb.Done(now, w.User, Result{Failed: true, Unsent: true})
		}
	}
	w := due(tb, 3000+ttl)
	if len(w) != 1 || len(w[0].Release) != 1 || w[0].Release[0].ID != "phone" || len(w[0].Claim) != 0 {
		t.Fatalf("work after the ttl: %+v, want phone's release only (tab was never sent)", w)
	}
	tb.Done(3000+ttl, "alice", Result{})
	if tb.Len() != 0 {
		t.Errorf("%d devices held", tb.Len())
	}
}

func TestDeathDuringAnOutageIsReleasedWhenTheStoreAnswers(t *testing.T) {
	tb := newTable()
	claim(t, tb, 1000, "alice", "phone")
	// The store is down from 20 s; the device's ttl runs out at 31 s.
	var release []Work
	for now := int64(20_000); now < 60_000; now += 1000 {
		for _, w := range due(tb, now) {
			if now < 50_000 {
				tb.Done(now, w.User, Result{Failed: true})
				continue
			}
			release = append(release, w)
			tb.Done(now, w.User, Result{})
		}
	}
	if len(release) != 1 || len(release[0].Release) != 1 || release[0].Release[0].LastBeat != 1000 {
		t.Fatalf("work once the store answered: %+v, want one release with the last beat", release)
	}
}

func TestLostAndRefusedDevicesAreForgotten(t *testing.T) {
	tb := newTable()
	tb.Beat(1000, "alice", "phone", true, false)
	tb.Done(1000, "alice", Result{Lost: []string{"phone"}})
	if tb.Len() != 0 {
		t.Fatal("a device another node holds is still held")
	}
	tb.Beat(1000, "bob", "d33", true, false)
	tb.Done(1000, "bob", Result{Refused: []string{"d33"}})
	if tb.Len() != 0 {
		t.Fatal("a refused device is still held")
	}
}

func TestUnclaimClaimsEverythingAgain(t *testing.T) {
	tb := newTable()
	claim(t, tb, 1000, "alice", "phone")
	claim(t, tb, 1000, "bob", "pc")
	tb.Unclaim(2000)
	var claimed []string
	for _, w := range due(tb, 2000) {
		for _, d := range w.Claim {
			claimed = append(claimed, w.User+"/"+d.ID)
		}
		tb.Done(2000, w.User, Result{})
	}
	slices.Sort(claimed)
	if !slices.Equal(claimed, []string{"alice/phone", "bob/pc"}) {
		t.Fatalf("claimed again: %v", claimed)
	}
	// Work handed out before an Unclaim claims nothing when it is done.
	if tb.Beat(3000, "carol", "tab", true, false) != NeedClaim {
		t.Fatal("want a claim")
	}
	tb.Unclaim(3000)
	tb.Done(3000, "carol", Result{})
	var again bool
	for _, w := range due(tb, 3000) {
		again = again || w.User == "carol" && len(w.Claim) == 1
	}
	if !again {
		t.Fatal("a claim answered across an Unclaim is not claimed again")
	}
}

func TestStoreThatLostTheUserGetsItsDevicesClaimedAgain(t *testing.T) {
	tb := newTable()
	claim(t, tb, 1000, "alice", "phone")
	tb.Beat(1000, "alice", "tab", true, false)
	tb.Done(1000, "alice", Result{})
	// Both devices keep beating in the background: their touch comes due
	// when their activity turns idle.
	var touched bool
	for now := int64(15_000); now <= 1000+idle+15_000 && !touched; now += 15_000 {
		tb.Beat(now, "alice", "phone", false, false)
		tb.Beat(now, "alice", "tab", false, false)
		for _, w := range due(tb, now) {
			// The touch finds the user gone from the store (it lost
			// its data).
			touched = len(w.Touch) > 0
			tb.Done(now, w.User, Result{Reclaim: true})
		}
	}
	if !touched {
		t.Fatal("no touch came due")
	}
	w := due(tb, 1000+idle+15_000)
	var got []string
	for _, x := range w {
		for _, d := range x.Claim {
			got = append(got, d.ID)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"phone", "tab"}) {
		t.Fatalf("claimed again after the store lost the user: %v (%+v)", got, w)
	}
}

func TestByeWhileAClaimIsInFlightIsReleasedAfterIt(t *testing.T) {
	tb := newTable()
	if tb.Beat(1000, "alice", "phone", true, false) != NeedClaim {
		t.Fatal("want a claim")
	}
	if _, how := tb.Remove(1100, "alice", "phone"); how != Deferred {
		t.Fatalf("bye during the claim: %v, want Deferred", how)
	}
	tb.Done(1200, "alice", Result{}) // the claim landed
	w := due(tb, 1200)
	if len(w) != 1 || len(w[0].Bye) != 1 {
		t.Fatalf("work after the claim: %+v, want the bye", w)
	}
	tb.Done(1200, "alice", Result{})
	if tb.Len() != 0 {
		t.Errorf("%d devices held after the bye", tb.Len())
	}
	// A bye of a claimed device: the caller releases it.
	claim(t, tb, 2000, "bob", "pc")
	if _, how := tb.Remove(2100, "bob", "pc"); how != Release {
		t.Fatalf("bye of a claimed device: %v", how)
	}
	if _, how := tb.Remove(2100, "bob", "pc"); how != NotHeld {
		t.Fatalf("second bye: %v", how)
	}
}

func TestDirtyNamesUsersWhoBeatOnce(t *testing.T) {
	tb := newTable()
	claim(t, tb, 1000, "alice", "phone")
	tb.Beat(5000, "alice", "phone", true, false)
	tb.Beat(4000, "alice", "tab", true, false) // older than phone's
	got := tb.Dirty(nil)
	if len(got) != 1 || got[0].UserID != "alice" || got[0].LastSeen != 5000 {
		t.Fatalf("dirty: %+v", got)
	}
	if got := tb.Dirty(nil); len(got) != 0 {
		t.Fatalf("dirty again without a beat: %+v", got)
	}
	// A user whose device said bye keeps its last beat for the checkpoint.
	tb.Beat(6000, "alice", "phone", true, false)
	tb.Remove(6500, "alice", "phone")
	tb.Remove(6500, "alice", "tab")
	if got := tb.Dirty(nil); len(got) != 1 || got[0].LastSeen != 6000 {
		t.Fatalf("dirty after byes: %+v", got)
	}
}

func BenchmarkBeat(b *testing.B) {
	tb := newTable()
	const users = 10_000
	ids := make([]string, users)
	for i := range ids {
		ids[i] = "u" + string(rune('a'+i%26)) + string(rune('0'+i/26%10)) + string(rune('a'+i/260%26)) + string(rune('0'+i/6760))
		tb.Beat(1, ids[i], "d", true, false)
		tb.Done(1, ids[i], Result{})
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			tb.Beat(2, ids[i%users], "d", true, false)
			i++
		}
	})
}

// The store keeps no idle deadline for owned devices: when the user's
// activity here turns idle_after old, the table hands out one touch (the
// store then turns them away), and an active beat afterwards needs a
// touch at once (back online).
func TestIdleUserIsSettledOnce(t *testing.T) {
	tb := newTable()
	claim(t, tb, 1000, "alice", "phone")
	var touches []int64
	for now := int64(15_000); now <= 1000+2*idle; now += 15_000 {
		if need := tb.Beat(now, "alice", "phone", false, false); need != NeedNothing {
			t.Fatalf("background beat at %d: need %d", now, need)
		}
		for _, w := range due(tb, now) {
			if len(w.Touch) != 1 || w.Touch[0].LastActive != 1000 || w.Touch[0].Active {
				t.Fatalf("work at %d: %+v", now, w)
			}
			touches = append(touches, now)
			tb.Done(now, w.User, Result{})
		}
	}
	if len(touches) != 1 || touches[0] < 1000+idle || touches[0] > 1000+idle+15_000 {
		t.Fatalf("touches at %v, want one as her activity turned idle (%d)", touches, 1000+idle)
	}
	if need := tb.Beat(1000+2*idle+1, "alice", "phone", true, false); need != NeedTouch {
		t.Fatalf("active beat of an idle user: need %d, want a touch", need)
	}
}

// After an outage the table makes again what the store acknowledged just
// before it (a failover may have lost it): recent claims, and recent
// releases of devices that did not come back.
func TestRedoRecentWrites(t *testing.T) {
	tb := newTable()
	claim(t, tb, 1000, "old", "phone")   // acknowledged long before the outage
	claim(t, tb, 50_000, "new", "phone") // just before it
	claim(t, tb, 1000, "gone", "phone")
	claim(t, tb, 1000, "back", "phone")
	tb.Beat(45_000, "old", "phone", true, false) // alive, its claim old
	for _, u := range []string{"gone", "back"} {
		if _, how := tb.Remove(49_000, u, "phone"); how != Release {
			t.Fatal("want a release")
		}
		tb.Released(49_000, u, Device{ID: "phone", LastBeat: 1000}, true)
	}
	claim(t, tb, 49_500, "back", "phone") // reconnected
	redo := tb.Redo(60_000, 45_000)
	if len(redo) != 1 || redo[0].User != "gone" || !redo[0].Bye {
		t.Fatalf("releases to make again: %+v, want gone's bye only", redo)
	}
	var claims []string
	for _, w := range due(tb, 60_000) {
		for _, d := range w.Claim {
			claims = append(claims, w.User+"/"+d.ID)
		}
		tb.Done(60_000, w.User, Result{})
	}
	slices.Sort(claims)
	if !slices.Equal(claims, []string{"back/phone", "new/phone"}) {
		t.Fatalf("claims made again: %v", claims)
	}
	if again := tb.Redo(61_000, 45_000); len(again) != 0 {
		t.Fatalf("releases made again twice: %+v", again)
	}
}

// claimFrom is claim of a device whose heartbeats come from src.
func claimFrom(t *testing.T, tb *Table, now int64, src Source, user, dev string) {
	t.Helper()
	if need := tb.BeatFrom(now, src, user, dev, true, false); need != NeedClaim {
		t.Fatalf("first beat of %s/%s: need %d, want a claim", user, dev, need)
	}
	tb.Done(now, user, Result{})
}

func TestHandOffGivesASourcesDevicesBack(t *testing.T) {
	tb := newTable()
	claimFrom(t, tb, 1000, 7, "alice", "phone")
	claimFrom(t, tb, 1000, 7, "bob", "pc")
	claim(t, tb, 1000, "carol", "tab") // a socket's
	tb.BeatFrom(3500, 8, "dave", "watch", true, false)
	tb.Done(3500, "dave", Result{Failed: true, Unsent: true}) // never reached the store; retried at 4.5 s
	tb.BeatFrom(3000, 7, "alice", "phone", false, false)
	if n := tb.HandOff(4000, 7); n != 2 {
		t.Fatalf("HandOff(7) found %d devices, want 2", n)
	}
	if got := tb.Devices(4000, "alice", nil); len(got) != 1 {
		t.Fatalf("alice while her hand-off waits: %+v (she lives by the rules)", got)
	}
	w := due(tb, 4000)
	if len(w) != 2 {
		t.Fatalf("work after HandOff: %+v", w)
	}
	for _, x := range w {
		if len(x.HandOff) != 1 || len(x.Claim)+len(x.Touch)+len(x.Release)+len(x.Bye) != 0 {
			t.Fatalf("work of %s: %+v", x.User, x)
		}
		if x.User == "alice" && (x.HandOff[0].LastBeat != 3000 || x.HandOff[0].LastActive != 1000 || x.HandOff[0].Active) {
			t.Fatalf("alice handed off as %+v: want her real last beat and activity", x.HandOff[0])
		}
	}
	tb.Done(4000, "alice", Result{})
	tb.Done(4000, "bob", Result{Lost: []string{"pc"}}) // another node has bob already
	if n := tb.HandingOff([]Source{7}); n != 0 {
		t.Fatalf("%d devices of source 7 left after the store took them", n)
	}
	if n := tb.HandOff(4000, 8); n != 1 {
		t.Fatalf("HandOff(8) found %d devices", n)
	}
	if w := due(tb, 5000); len(w) != 0 {
		t.Fatalf("a device the store never held was handed off: %+v", w)
	}
	if n, all := tb.HandingOff([]Source{8}), tb.Len(); n != 0 || all != 1 {
		t.Fatalf("source 8 holds %d, the table %d devices; want carol's alone", n, all)
	}
	// The hand-off is remembered for Redo as a hand-off, not a release.
	r := tb.Redo(5000, 0)
	if len(r) != 1 || r[0].User != "alice" || !r[0].HandOff || r[0].Bye {
		t.Fatalf("Redo after the hand-off: %+v", r)
	}
}

func TestBeatDuringAHandOffClaimsAgain(t *testing.T) {
	for _, failed := range []bool{false, true} {
		tb := newTable()
		claimFrom(t, tb, 1000, 7, "alice", "phone")
		tb.HandOff(2000, 7)
		w := due(tb, 2000)
		if len(w) != 1 || len(w[0].HandOff) != 1 {
			t.Fatalf("work: %+v", w)
		}
		// The source came back (or the device beats through a socket)
		// while the hand-off is in flight.
		if need := tb.BeatFrom(2500, 7, "alice", "phone", true, false); need != NeedNothing {
			t.Fatalf("beat during the hand-off: need %d", need)
		}
		tb.Done(2600, "alice", Result{Failed: failed})
		// The store may hold her by the rules now, whether the
		// hand-off's answer came or not: she is claimed again.
		w = due(tb, 2600+time.Second.Milliseconds())
		if len(w) != 1 || len(w[0].Claim) != 1 || len(w[0].HandOff) != 0 {
			t.Fatalf("failed=%v: work after the hand-off: %+v", failed, w)
		}
	}
	// Revived before the hand-off was sent: claimed again too.
	tb := newTable()
	claimFrom(t, tb, 1000, 7, "alice", "phone")
	tb.HandOff(2000, 7)
	if need := tb.BeatFrom(2500, 7, "alice", "phone", true, false); need != NeedClaim {
		t.Fatalf("beat before the hand-off was sent: need %d, want a claim", need)
	}
	// Nothing of source 7 waits for a hand-off any more: a caller waiting
	// for its hand-off does not wait for her.
	if n := tb.HandingOff([]Source{7}); n != 0 {
		t.Fatalf("%d devices waiting for their hand-off after the only one beat again", n)
	}
}

// handingScan counts the devices of src waiting for their hand-off by
// looking at every device: what HandingOff's counts must agree with.
func handingScan(tb *Table, src Source) int {
	n := 0
	for i := range tb.shards {
		sh := &tb.shards[i]
		sh.mu.Lock()
		for _, u := range sh.users {
			for j := range u.devs {
				if d := &u.devs[j]; d.handOff && d.handSrc == src {
					n++
				}
			}
		}
		sh.mu.Unlock()
	}
	return n
}

// HandingOff's counts follow every way a hand-off ends: done, lost,
// failed and retried, revived before it was sent and while in flight,
// a bye, a store that lost the user.
func TestHandingOffCountsFollowTheDevices(t *testing.T) {
	tb := newTable()
	check := func(when string) {
		t.Helper()
		for _, src := range []Source{7, 8} {
			if got, want := tb.HandingOff([]Source{src}), handingScan(tb, src); got != want {
				t.Fatalf("%s: HandingOff(%d) = %d, the devices say %d", when, src, got, want)
			}
		}
	}
	for i := range 20 {
		claimFrom(t, tb, 1000, Source(7+i%2), fmt.Sprintf("u%d", i), "d")
	}
	claimFrom(t, tb, 1000, 7, "u0", "second")
	tb.HandOff(2000, 7)
	tb.HandOff(2000, 8)
	check("after HandOff")
	if n := tb.HandingOff([]Source{7, 8}); n != 22-1 {
		t.Fatalf("HandingOff(7, 8) = %d, want 21", n)
	}
	tb.BeatFrom(2100, 7, "u2", "d", true, false) // revived before it was sent
	check("after a revival")
	if _, how := tb.Remove(2100, "u4", "d"); how != Release {
		t.Fatalf("bye of a device waiting for its hand-off: %v", how)
	}
	check("after a bye")
	w := due(tb, 2200)
	check("with the hand-offs in flight")
	for _, x := range w {
		switch x.User {
		case "u6":
			tb.BeatFrom(2250, 7, "u6", "d", true, false) // revived in flight
			tb.Done(2300, x.User, Result{})
		case "u8":
			tb.Done(2300, x.User, Result{Failed: true})
		case "u10":
			tb.Done(2300, x.User, Result{Lost: []string{"d"}})
		case "u1":
			tb.Done(2300, x.User, Result{Reclaim: true})
		default:
			tb.Done(2300, x.User, Result{})
		}
	}
	check("after the answers")
	if n := tb.HandingOff([]Source{7, 8}); n != 1 {
		t.Fatalf("HandingOff(7, 8) = %d after the answers; want u8's failed one", n)
	}
	for _, x := range due(tb, 2300+time.Second.Milliseconds()) {
		tb.Done(3400, x.User, Result{})
	}
	check("after the retry")
	if n := tb.HandingOff([]Source{7, 8}); n != 0 {
		t.Fatalf("HandingOff(7, 8) = %d at the end", n)
	}
}
