package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/tracker"
)

// truth is the snapshot of user at now derived by the test from the whole
// user (Debug): the user's state by the rules, last seen now while a node
// owns one of its devices.
func truth(t *testing.T, s *redisstore.Store, rules presence.Rules, now int64, user string, floor uint64) presence.Snapshot {
	t.Helper()
	u, _, ok, err := s.Debug(context.Background(), user)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return presence.Snapshot{UserID: user, Version: floor}
	}
	var snap presence.Snapshot
	u.Snapshot(&rules, now, &snap)
	for _, d := range u.Devices {
		if d.Owner != 0 && snap.Status != presence.Offline {
			snap.LastSeen = max(snap.LastSeen, now)
			if snap.Status != presence.Invisible {
				snap.PubLastSeen = max(snap.PubLastSeen, now)
			}
			break
		}
	}
	return snap
}

// TestReadsMatchTheRules plays random histories of every operation —
// HTTP beats (read back or not), statuses, byes, disconnects, settings,
// and the owned devices' claims, touches, releases and hand-offs that the
// differential test does not play — and checks after every step that
// Get, which decodes each user from its bucket in a batch, answers what
// the rules derive from the whole user, and that a beat read back answers
// what Get reads.
func TestReadsMatchTheRules(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	seeds, steps := 24, 400
	if testing.Short() {
		seeds, steps = 4, 150
	}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 0xbeef))
			rules := presence.Rules{TTL: 5 * time.Second, IdleAfter: 12 * time.Second, MaxDevices: 3, CloseGrace: 2 * time.Second}.WithDefaults()
			s := newStore(t, c, redisstore.Config{Rules: rules, Shards: 1 + r.IntN(3), EvictAfter: 30 * time.Second})
			users := []string{"a", "b", "c"}
			devs := []string{"phone", "pc"}
			owned := []string{"tab1", "tab2"}
			leases := []uint64{7, 8}
			now := int64(1_700_000_000_000)
			var log []string
			load(t, s, now, users...)
			for i := range steps {
				now += []int64{0, 1, 300, 1000, 2000, 5000, 13000}[r.IntN(7)]
				u := users[r.IntN(len(users))]
				var what string
				var err error
				switch op := r.IntN(14); op {
				case 0, 1, 2:
					d, act := devs[r.IntN(2)], r.IntN(2) == 0
					what = fmt.Sprintf("beat %s/%s active=%v", u, d, act)
					var snap presence.Snapshot
					var ok bool
					_, ok, err = s.BeatRead(ctx, now, u, d, act, &snap)
					if err == nil && ok {
						if want := truth(t, s, rules, now, u, 0); snap != want {
							t.Errorf("step %d %s: read back %+v\n want (hash) %+v", i, what, snap, want)
						}
					}
				case 3:
					m := presence.Manual(r.IntN(4))
					what = fmt.Sprintf("status %s %d", u, m)
					_, err = s.SetStatus(ctx, now, u, m, []string{"", "x:y"}[r.IntN(2)])
				case 4:
					d := devs[r.IntN(2)]
					what = fmt.Sprintf("bye %s/%s", u, d)
					_, err = s.Bye(ctx, now, u, d)
				case 5:
					d := devs[r.IntN(2)]
					what = fmt.Sprintf("disconnect %s/%s", u, d)
					_, err = s.Disconnect(ctx, now, u, d, now-int64(r.IntN(2000)))
				case 6:
					what = fmt.Sprintf("settings %s", u)
					_, err = s.SetSettings(ctx, now, u, &presence.Settings{Status: presence.Visibility(r.IntN(3)), LastSeen: presence.Visibility(r.IntN(3))})
				case 7:
					l, d := leases[r.IntN(2)], owned[r.IntN(2)]
					// Active, or idle_after old: the owner tells Redis when
					// the device turns idle (Redis keeps no idle deadline of
					// an owned device).
					la := presence.Forever
					if r.IntN(3) == 0 {
						la = now - rules.IdleAfter.Milliseconds() - int64(r.IntN(5000))
					}
					what = fmt.Sprintf("claim %s/%s by %d la=%d", u, d, l, la)
					_, err = s.Claim(ctx, now, l, u, tracker.OwnedDevice{ID: d, LastBeat: now, LastActive: la})
				case 8, 9:
					l, d := leases[r.IntN(2)], owned[r.IntN(2)]
					// Active, or idle_after old: the owner tells Redis when
					// the device turns idle (Redis keeps no idle deadline of
					// an owned device).
					la := presence.Forever
					if r.IntN(3) == 0 {
						la = now - rules.IdleAfter.Milliseconds() - int64(r.IntN(5000))
					}
					what = fmt.Sprintf("touch %s/%s by %d la=%d", u, d, l, la)
					ts := []tracker.Touch{{User: u, Devices: []tracker.OwnedDevice{{ID: d, LastBeat: now, LastActive: la}}}}
					s.Touch(ctx, now, l, ts)
					err = ts[0].Err
				case 10:
					l, d := leases[r.IntN(2)], owned[r.IntN(2)]
					what = fmt.Sprintf("release %s/%s by %d", u, d, l)
					if r.IntN(2) == 0 {
						_, _, err = s.Release(ctx, now, l, u, []tracker.OwnedDevice{{ID: d, LastBeat: now, LastActive: now}}, r.IntN(2) == 0)
					} else {
						_, _, err = s.HandOff(ctx, now, l, u, []tracker.OwnedDevice{{ID: d, LastBeat: now, LastActive: now}})
					}
				case 12:
					l := leases[r.IntN(2)]
					what = fmt.Sprintf("takeover of %d", l)
					_, err = s.TakeOver(ctx, now, l, now-int64(r.IntN(3000)), nil, nil)
				case 13:
					// A batch of beats of several users, some twice.
					var bs []redisstore.BeatArgs
					for range 1 + r.IntN(5) {
						bs = append(bs, redisstore.BeatArgs{User: users[r.IntN(len(users))], Device: devs[r.IntN(2)], Now: now, Active: r.IntN(2) == 0})
					}
					what = fmt.Sprintf("batch %+v", bs)
					if s.Parts() == 1 {
						_, errs := s.BeatBatch(ctx, bs)
						for _, e := range errs {
							if e != nil && !errors.Is(e, tracker.ErrNotLoaded) && !errors.Is(e, presence.ErrTooManyDevices) {
								err = e
							}
						}
					}
				case 11:
					what = "sweep and checkpoint"
					if _, err = s.Expire(ctx, now, 1000, nil); err == nil {
						_, err = s.Dirty(ctx, nil)
					}
					if r.IntN(4) == 0 {
						load(t, s, now, users...) // evicted ones come back
					}
				}
				log = append(log, fmt.Sprintf("%d @%d %s", i, now, what))
				if err != nil && !errors.Is(err, tracker.ErrNotLoaded) && !errors.Is(err, presence.ErrTooManyDevices) {
					t.Fatalf("step %d %s: %v", i, what, err)
				}
				at := now + int64(r.IntN(3))*700
				out := make([]presence.Snapshot, len(users))
				if err := s.Get(ctx, at, users, out); err != nil {
					t.Fatal(err)
				}
				for j, u := range users {
					want := truth(t, s, rules, at, u, out[j].Version)
					if out[j] != want {
						t.Errorf("step %d (%s) Get(%s) at %d:\n got  %+v\n want %+v", i, what, u, at, out[j], want)
					}
				}
				if t.Failed() {
					t.Logf("history:\n%s", strings.Join(log, "\n"))
					return
				}
			}
		})
	}
}

// A touch that takes the fast path moves the user's last_seen, and a read
// on a node whose clock is a little behind the owner's (the store allows
// clocks out of step) shows it: not the reader's now, before the last beat
// Redis holds.
func TestFastTouchMovesLastSeen(t *testing.T) {
	s := leaseStore(t)
	ctx := context.Background()
	rules := leaseRules.WithDefaults()
	const t0 = int64(1_000_000)
	load(t, s, t0, "u", "inv")
	mustClaim(t, s, t0, 7, "u", "tab", t0, presence.Forever)
	mustClaim(t, s, t0, 7, "inv", "tab", t0, presence.Forever)
	if _, err := s.SetStatus(ctx, t0, "inv", presence.ManualInvisible, ""); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"u", "inv"} {
		if _, _, err := touch1(s, t0+5000, 7, u, []tracker.OwnedDevice{{ID: "tab", LastBeat: t0 + 5000, LastActive: presence.Forever}}); err != nil {
			t.Fatal(err)
		}
		at := int64(t0 + 4500) // a reader 500 ms behind the owner
		want := truth(t, s, rules, at, u, 0)
		if want.LastSeen != t0+5000 {
			t.Fatalf("%s: the user's last_seen %d, want the touch's beat %d", u, want.LastSeen, t0+5000)
		}
		if got := get(t, s, at, u); got != want {
			t.Errorf("%s read at %d after a touch at %d:\n got  %+v\n want %+v", u, at, t0+5000, got, want)
		}
	}
}
