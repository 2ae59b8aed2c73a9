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

// TestAgainstPlainUsers drives the store and a plain map of presence.User
// values (the state model with nothing in between) with the same random
// operations — beats of several devices, statuses with and without text,
// byes, disconnects, settings, sweeps — and checks that every change, read
// and debug view agrees: the table that packs users without pointers must
// hold exactly what the model says.
func TestAgainstPlainUsers(t *testing.T) {
	r := presence.Rules{TTL: 10 * time.Second, IdleAfter: 30 * time.Second, CloseGrace: 2 * time.Second, MaxDevices: 4}.WithDefaults()
	for seed := range uint64(8) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 3))
			s := memstore.New(memstore.Config{Rules: r, Shards: 4, EvictAfter: 1000 * time.Hour})
			ref := map[string]*presence.User{}
			ctx := context.Background()
			ids := []string{"a", "b", "c", strings.Repeat("long-", 8) + "1", strings.Repeat("long-", 8) + "2"}
			for _, id := range ids {
				p := presence.Profile{UserID: id, Text: map[bool]string{true: "stored text"}[id == "b"]}
				if err := s.Load(ctx, 0, &p); err != nil {
					t.Fatal(err)
				}
				ref[id] = presence.NewUser(p)
			}
			now := int64(1_000)
			for step := range 3000 {
				now += int64(rng.IntN(1500))
				id := ids[rng.IntN(len(ids))]
				dev := fmt.Sprint("device-", rng.IntN(6))
				u := ref[id]
				var got, want presence.Change
				var gerr, werr error
				switch op := rng.IntN(10); {
				case op < 5:
					active := rng.IntN(3) > 0
					got, gerr = s.Beat(ctx, now, id, dev, active)
					want, werr = u.Beat(&r, now, dev, active)
				case op == 5:
					m := presence.Manual(rng.IntN(4))
					text := []string{"", "in a meeting", "🌴 away"}[rng.IntN(3)]
					got, gerr = s.SetStatus(ctx, now, id, m, text)
					want = u.SetStatus(&r, now, m, text)
				case op == 6:
					got, gerr = s.Bye(ctx, now, id, dev)
					want = u.Bye(&r, now, dev)
				case op == 7:
					since := now - int64(rng.IntN(3000))
					got, gerr = s.Disconnect(ctx, now, id, dev, since)
					want = u.Disconnect(&r, now, dev, since)
				case op == 8:
					set := presence.Settings{Status: presence.Visibility(rng.IntN(3)), LastSeen: presence.Visibility(rng.IntN(3))}
					got, gerr = s.SetSettings(ctx, now, id, &set)
					want = u.SetSettings(&r, now, set)
				default:
					out, err := s.Expire(ctx, now, 100, nil)
					if err != nil {
						t.Fatal(err)
					}
					var wantOut []presence.Change
					for _, id := range ids {
						if ch := ref[id].Expire(&r, now); ch.Changed {
							wantOut = append(wantOut, ch)
						}
					}
					byUser := func(a, b presence.Change) int { return strings.Compare(a.Event.UserID, b.Event.UserID) }
					slices.SortFunc(out, byUser)
					if !reflect.DeepEqual(out, wantOut) && !(len(out) == 0 && len(wantOut) == 0) {
						t.Fatalf("step %d: Expire at %d: got %+v, want %+v", step, now, out, wantOut)
					}
				}
				if gerr != werr || !reflect.DeepEqual(got, want) {
					t.Fatalf("step %d (%s): got %+v, %v; want %+v, %v", step, id, got, gerr, want, werr)
				}
				snaps := make([]presence.Snapshot, len(ids))
				if err := s.Get(ctx, now, ids, snaps); err != nil {
					t.Fatal(err)
				}
				for i, id := range ids {
					var w presence.Snapshot
					ref[id].Snapshot(&r, now, &w)
					if snaps[i] != w {
						t.Fatalf("step %d: Get(%s) = %+v, want %+v", step, id, snaps[i], w)
					}
					du, _, ok, err := s.Debug(ctx, id)
					if err != nil || !ok {
						t.Fatalf("Debug(%s): %v, %v", id, ok, err)
					}
					wu := *ref[id]
					if len(wu.Devices) == 0 {
						wu.Devices = nil
					}
					if len(du.Devices) == 0 {
						du.Devices = nil
					}
					if !reflect.DeepEqual(du, wu) {
						t.Fatalf("step %d: Debug(%s) = %+v, want %+v", step, id, du, wu)
					}
				}
			}
		})
	}
}
