package memstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/presence"
)

// TestAgainstPlainUsers drives the store and plain presence.User values
// with the same random operations (beats, statuses, byes, disconnects,
// settings, checkpoints, sweeps) with eviction on
// (records are dropped and their indices reused), ids of every awkward
// length (empty, 36 bytes exactly, longer ones sharing their first 36 bytes,
// 64 bytes), device ids of many lengths, the empty one included (so the
// arena fills with garbage and is compacted), and checks after every step
// that every user held shows exactly the model's state, and that every id
// string Dirty and Expire handed out is still what it was.
func TestAgainstPlainUsers(t *testing.T) {
	r := presence.Rules{TTL: 3 * time.Second, IdleAfter: 5 * time.Second, CloseGrace: time.Second, MaxDevices: 40}.WithDefaults()
	p36 := strings.Repeat("x", 36)
	ids := []string{"", "a", "b", p36, p36[:35] + "y", p36 + "1", p36 + "2", p36 + "12", strings.Repeat("z", 64), strings.Repeat("x", 63) + "q"}
	for i := range 30 {
		ids = append(ids, fmt.Sprint("u", i, strings.Repeat("-", i)))
	}
	for seed := range uint64(6) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 11))
			s := memstore.New(memstore.Config{Rules: r, Shards: 2, EvictAfter: 2 * time.Second})
			ctx := context.Background()
			ref := map[string]*presence.User{}
			type handed struct{ got, want string }
			var kept []handed
			now := int64(1_000)
			ensure := func(id string) {
				if _, _, ok, _ := s.Debug(ctx, id); ok {
					return
				}
				p := presence.Profile{UserID: id}
				if u := ref[id]; u != nil {
					if len(u.Devices) != 0 {
						t.Fatalf("%q was evicted with %d devices", id, len(u.Devices))
					}
					p = u.Profile
				}
				if err := s.Load(ctx, now, &p); err != nil {
					t.Fatal(err)
				}
				ref[id] = presence.NewUser(p)
			}
			for step := range 4000 {
				now += int64(rng.IntN(700))
				id := ids[rng.IntN(len(ids))]
				dev := strings.Repeat("d", rng.IntN(5)*rng.IntN(17)) + fmt.Sprint(rng.IntN(4))
				if rng.IntN(8) == 0 {
					dev = ""
				}
				ensure(id)
				u := ref[id]
				var got, want presence.Change
				var gerr, werr error
				switch op := rng.IntN(12); {
				case op < 5:
					active := rng.IntN(3) > 0
					got, gerr = s.Beat(ctx, now, id, dev, active)
					want, werr = u.Beat(&r, now, dev, active)
				case op == 5:
					m := presence.Manual(rng.IntN(4))
					text := []string{"", "meeting", "🌴"}[rng.IntN(3)]
					got, gerr = s.SetStatus(ctx, now, id, m, text)
					want = u.SetStatus(&r, now, m, text)
				case op == 6:
					got, gerr = s.Bye(ctx, now, id, dev)
					want = u.Bye(&r, now, dev)
				case op == 7:
					since := now - int64(rng.IntN(3000))
					got, gerr = s.Disconnect(ctx, now, id, dev, since)
					want = u.Disconnect(&r, now, dev, since)
				case op == 9:
					set := presence.Settings{Status: presence.Visibility(rng.IntN(3)), LastSeen: presence.Visibility(rng.IntN(3))}
					got, gerr = s.SetSettings(ctx, now, id, &set)
					want = u.SetSettings(&r, now, set)
				case op == 8:
					ps, err := s.Dirty(ctx, nil)
					if err != nil {
						t.Fatal(err)
					}
					for _, p := range ps {
						kept = append(kept, handed{p.UserID, strings.Clone(p.UserID)})
					}
				default:
					out, err := s.Expire(ctx, now, 1000, nil)
					if err != nil {
						t.Fatal(err)
					}
					for _, ch := range out {
						kept = append(kept, handed{ch.Event.UserID, strings.Clone(ch.Event.UserID)})
					}
					var wantOut []presence.Change
					for _, id := range ids {
						if u := ref[id]; u != nil {
							if ch := u.Expire(&r, now); ch.Changed {
								wantOut = append(wantOut, ch)
							}
						}
					}
					byUser := func(a, b presence.Change) int { return strings.Compare(a.Event.UserID, b.Event.UserID) }
					slices.SortFunc(out, byUser)
					slices.SortFunc(wantOut, byUser)
					if !reflect.DeepEqual(out, wantOut) && !(len(out) == 0 && len(wantOut) == 0) {
						t.Fatalf("step %d: Expire at %d: got %+v, want %+v", step, now, out, wantOut)
					}
				}
				if gerr != werr || !reflect.DeepEqual(got, want) {
					t.Fatalf("step %d (%q, dev %q): got %+v, %v; want %+v, %v", step, id, dev, got, gerr, want, werr)
				}
				snaps := make([]presence.Snapshot, len(ids))
				if err := s.Get(ctx, now, ids, snaps); err != nil {
					t.Fatal(err)
				}
				for i, id := range ids {
					du, _, ok, err := s.Debug(ctx, id)
					if err != nil {
						t.Fatal(err)
					}
					if !ok {
						if snaps[i] != (presence.Snapshot{UserID: id}) {
							t.Fatalf("step %d: Get(%q) of a user not held = %+v", step, id, snaps[i])
						}
						continue
					}
					var w presence.Snapshot
					ref[id].Snapshot(&r, now, &w)
					if snaps[i] != w {
						t.Fatalf("step %d: Get(%q) = %+v, want %+v", step, id, snaps[i], w)
					}
					wu := *ref[id]
					if len(wu.Devices) == 0 {
						wu.Devices = nil
					}
					if len(du.Devices) == 0 {
						du.Devices = nil
					}
					if !reflect.DeepEqual(du, wu) {
						t.Fatalf("step %d: Debug(%q) = %+v, want %+v", step, id, du, wu)
					}
				}
				for _, k := range kept {
					if k.got != k.want {
						t.Fatalf("step %d: an id handed out as %q now reads %q", step, k.want, k.got)
					}
				}
			}
			if s.Compactions() == 0 {
				t.Errorf("no arena was compacted: the test does not test compaction")
			}
			t.Logf("%d users held at the end, %d ids handed out, %d compactions", s.Len(), len(kept), s.Compactions())
		})
	}
}
