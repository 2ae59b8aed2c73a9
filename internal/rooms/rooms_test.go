package rooms

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/presenced/presenced/internal/presence"
)

// model is the plain-map truth the table is checked against.
type model struct {
	users map[UserRef]*muser
	// last is each room's latest version seen in an event; cont says the
	// room kept a member since that event, so the next is last+1.
	last map[string]uint64
	cont map[string]bool
}

type muser struct {
	id      string
	counted bool
	devs    map[string]map[string]bool // device → its rooms
}

func newModel() *model {
	return &model{users: map[UserRef]*muser{}, last: map[string]uint64{}, cont: map[string]bool{}}
}

// members returns each room's members.
func (m *model) members() map[string]map[string]bool {
	out := map[string]map[string]bool{}
	for _, u := range m.users {
		if !u.counted {
			continue
		}
		for _, rooms := range u.devs {
			for r := range rooms {
				if out[r] == nil {
					out[r] = map[string]bool{}
				}
				out[r][u.id] = true
			}
		}
	}
	return out
}

type ident struct {
	room, user string
	kind       presence.RoomKind
}

// TestTableAgainstMap runs random joins, leaves, leave-alls and
// visibility flips — invalid repeats included — on a table and on plain
// maps, and checks after every step the events, the counts, every room's
// pages, versions (strictly increasing, by one while the room has members,
// above the epoch), each user's devices and rooms and the stats. The
// crowded case grows rooms past many chunks, so splits, merges and the
// arenas' compactions all run under it.
func TestTableAgainstMap(t *testing.T) {
	cases := []struct {
		name                         string
		users, devs, rooms, maxRooms int
		shards, steps                int
	}{
		{"sparse", 12, 3, 20, 4, 2, 20000},
		{"one shard", 8, 2, 6, 3, 1, 10000},
		{"crowded", 200, 2, 2, 2, 2, 10000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			const epoch = 7
			tb := newHarness(Config{Rules: presence.RoomRules{MaxRooms: tc.maxRooms}, Epoch: epoch, Shards: tc.shards})
			m := newModel()
			rng := rand.New(rand.NewPCG(uint64(tc.users), 3))
			userID := func(u UserRef) string { return fmt.Sprintf("user-%d-%s", u, strings.Repeat("x", int(u)%40)) }
			devID := func() string { return fmt.Sprintf("dev-%d", rng.IntN(tc.devs)) }
			roomID := func() string { return fmt.Sprintf("room-%d", rng.IntN(tc.rooms)) }
			reasons := []presence.RoomReason{presence.ReasonLeft, presence.ReasonBye, presence.ReasonEnded}
			var out []presence.RoomEvent
			var strs []string
			before := m.members()
			steps := tc.steps
			if raceEnabled || testing.Short() {
				steps /= 4 // single-threaded: the race detector has little to see
			}
			for step := range steps {
				u := UserRef(rng.IntN(tc.users))
				mu := m.users[u]
				var got []presence.RoomEvent
				var wantReason presence.RoomReason
				var op string
				// Phases of joins and of leaves, so rooms grow and shrink.
				k := rng.IntN(10)
				if step/(steps/4)%2 == 1 && k < 5 && rng.IntN(5) != 0 {
					k = 5 + rng.IntN(2)
				}
				switch {
				case k < 5:
					d, r := devID(), roomID()
					counted := rng.IntN(4) != 0
					op = fmt.Sprintf("join(%d, %s, %s, %v)", u, d, r, counted)
					ev, ok, err := tb.Join(u, userID(u), d, r, counted, int64(step))
					if ok {
						got = append(got, ev)
					}
					wantReason = presence.ReasonJoined
					var in bool
					var n int
					if mu != nil {
						in = mu.devs[d][r]
						n = len(mu.devs[d])
					}
					switch {
					case in:
						if err != nil || ok {
							t.Fatalf("step %d: %s again = %v, %v, want a no-op", step, op, ok, err)
						}
					case n >= tc.maxRooms:
						if !errors.Is(err, presence.ErrTooManyRooms) {
							t.Fatalf("step %d: %s with %d rooms: err %v, want ErrTooManyRooms", step, op, n, err)
						}
					default:
						if err != nil {
							t.Fatalf("step %d: %s: %v", step, op, err)
						}
						if mu == nil {
							mu = &muser{id: userID(u), counted: counted, devs: map[string]map[string]bool{}}
							m.users[u] = mu
						}
						if mu.devs[d] == nil {
							mu.devs[d] = map[string]bool{}
						}
						mu.devs[d][r] = true
					}
				case k < 7:
					d, r := devID(), roomID()
					wantReason = reasons[rng.IntN(len(reasons))]
					op = fmt.Sprintf("leave(%d, %s, %s)", u, d, r)
					if ev, ok := tb.Leave(u, d, r, wantReason, int64(step)); ok {
						got = append(got, ev)
					}
					if mu != nil && mu.devs[d][r] {
						delete(mu.devs[d], r)
						if len(mu.devs[d]) == 0 {
							delete(mu.devs, d)
						}
					}
				case k < 8:
					d := devID()
					wantReason = reasons[rng.IntN(len(reasons))]
					op = fmt.Sprintf("leaveall(%d, %s)", u, d)
					got = tb.LeaveAll(u, d, wantReason, int64(step), out[:0])
					if mu != nil {
						delete(mu.devs, d)
					}
				default:
					counted := rng.IntN(2) == 0
					wantReason = presence.ReasonInvisible
					if counted {
						wantReason = presence.ReasonVisible
					}
					op = fmt.Sprintf("setcounted(%d, %v)", u, counted)
					got = tb.SetCounted(u, counted, int64(step), out[:0])
					if mu != nil {
						mu.counted = counted
					}
				}
				if mu != nil && len(mu.devs) == 0 {
					delete(m.users, u)
				}
				after := m.members()
				touched := map[string]bool{}

				// The events are exactly the changes of membership.
				var want []ident
				for r, ms := range after {
					for id := range ms {
						if !before[r][id] {
							want = append(want, ident{r, id, presence.RoomJoin})
						}
					}
				}
				for r, ms := range before {
					for id := range ms {
						if !after[r][id] {
							want = append(want, ident{r, id, presence.RoomLeave})
						}
					}
				}
				var gotIDs []ident
				for _, ev := range got {
					gotIDs = append(gotIDs, ident{ev.Room, ev.UserID, ev.Kind})
					touched[ev.Room] = true
					if ev.Reason != wantReason || ev.At != int64(step) {
						t.Fatalf("step %d: %s: event %+v, want reason %v at %d", step, op, ev, wantReason, step)
					}
					if ev.Count != len(after[ev.Room]) {
						t.Fatalf("step %d: %s: event %+v, want count %d", step, op, ev, len(after[ev.Room]))
					}
					last, seen := m.last[ev.Room]
					switch {
					case ev.Version <= epoch<<32:
						t.Fatalf("step %d: %s: event %+v: version at or below the epoch's", step, op, ev)
					case seen && ev.Version <= last:
						t.Fatalf("step %d: %s: event %+v: version not above %d", step, op, ev, last)
					case seen && m.cont[ev.Room] && ev.Version != last+1:
						t.Fatalf("step %d: %s: event %+v: version is not %d+1", step, op, ev, last)
					}
					m.last[ev.Room], m.cont[ev.Room] = ev.Version, true
				}
				byIdent := func(a, b ident) int {
					return cmp.Or(strings.Compare(a.room, b.room), strings.Compare(a.user, b.user), cmp.Compare(a.kind, b.kind))
				}
				slices.SortFunc(want, byIdent)
				slices.SortFunc(gotIDs, byIdent)
				if !slices.Equal(want, gotIDs) {
					t.Fatalf("step %d: %s: events %v, want %v", step, op, gotIDs, want)
				}
				for r := range m.cont {
					if len(after[r]) == 0 {
						m.cont[r] = false // empty: made again above the shard's floor
					}
				}

				// Counts and versions of every room; the pages of those
				// the step changed, and of every room now and then.
				for i := range tc.rooms {
					r := fmt.Sprintf("room-%d", i)
					ms := after[r]
					n, v := tb.Count(r)
					wantV := m.last[r]
					if len(ms) == 0 {
						wantV = 0
					}
					if n != len(ms) || v != wantV {
						t.Fatalf("step %d: %s: Count(%s) = %d, %d, want %d, %d", step, op, r, n, v, len(ms), wantV)
					}
					if !touched[r] && step%10 != 0 {
						continue
					}
					type key struct {
						h  uint32
						id string
					}
					var keys []key
					for id := range ms {
						keys = append(keys, key{orderHash(id), id})
					}
					slices.SortFunc(keys, func(a, b key) int { return cmp.Or(cmp.Compare(a.h, b.h), strings.Compare(a.id, b.id)) })
					var wantPage []string
					for _, k := range keys {
						wantPage = append(wantPage, k.id)
					}
					limit := 1 + rng.IntN(70)
					strs = strs[:0]
					after := ""
					for pages := 0; ; pages++ {
						var more bool
						start := len(strs)
						strs, _, v, more = tb.Page(r, after, limit, strs)
						if v != wantV {
							t.Fatalf("step %d: Page(%s) version %d, want %d", step, r, v, wantV)
						}
						if got := len(strs) - start; got > limit || more && got != limit {
							t.Fatalf("step %d: Page(%s, %q, %d) gave %d, more %v", step, r, after, limit, got, more)
						}
						if !more {
							break
						}
						after = strs[len(strs)-1]
						if pages > len(ms) {
							t.Fatalf("step %d: Page(%s) does not end", step, r)
						}
					}
					if !slices.Equal(strs, wantPage) && len(strs)+len(wantPage) > 0 {
						t.Fatalf("step %d: %s: pages of %s = %v, want %v", step, op, r, strs, wantPage)
					}
				}

				// Each user's devices and rooms; the stats.
				var st fullStats
				for _, ms := range after {
					if len(ms) > 0 {
						st.Rooms++
						st.Memberships += len(ms)
					}
				}
				for _, mu := range m.users {
					if mu.counted {
						st.Members++
					}
					for _, rooms := range mu.devs {
						st.DeviceRooms += len(rooms)
					}
				}
				// Every user now and then, else the one of the step.
				for ref := range tc.users {
					if step%50 != 0 && UserRef(ref) != u {
						continue
					}
					u := UserRef(ref)
					mu := m.users[u]
					if got := tb.InRooms(u); got != (mu != nil) {
						t.Fatalf("step %d: %s: InRooms(%d) = %v", step, op, u, got)
					}
					devs := slices.Sorted(func(yield func(string) bool) {
						if mu != nil {
							for d := range mu.devs {
								if !yield(d) {
									return
								}
							}
						}
					})
					strs = slices.Sorted(slices.Values(tb.Devices(u, strs[:0])))
					if !slices.Equal(strs, devs) && len(strs)+len(devs) > 0 {
						t.Fatalf("step %d: %s: Devices(%d) = %v, want %v", step, op, u, strs, devs)
					}
					for i := range tc.devs {
						d := fmt.Sprintf("dev-%d", i)
						var rooms []string
						if mu != nil {
							for r := range mu.devs[d] {
								rooms = append(rooms, r)
							}
						}
						slices.Sort(rooms)
						strs = slices.Sorted(slices.Values(tb.DeviceRooms(u, d, strs[:0])))
						if !slices.Equal(strs, rooms) && len(strs)+len(rooms) > 0 {
							t.Fatalf("step %d: %s: DeviceRooms(%d, %s) = %v, want %v", step, op, u, d, strs, rooms)
						}
					}
				}
				gotSt := tb.Stats()
				gotSt.Bytes = 0
				if gotSt != st {
					t.Fatalf("step %d: %s: Stats = %+v, want %+v", step, op, gotSt, st)
				}
				before = after
			}
		})
	}
}

// TestTooManyRooms: a device in MaxRooms rooms is refused one more, and
// the refusal changes nothing; another device of the user, or the same
// device after a leave, may join.
func TestTooManyRooms(t *testing.T) {
	tb := newHarness(Config{Rules: presence.RoomRules{MaxRooms: 3}})
	for i := range 3 {
		if _, ok, err := tb.Join(1, "ann", "phone", fmt.Sprint("r", i), true, 1); !ok || err != nil {
			t.Fatalf("join %d: %v, %v", i, ok, err)
		}
	}
	before := tb.Stats()
	if _, ok, err := tb.Join(1, "ann", "phone", "r3", true, 2); !errors.Is(err, presence.ErrTooManyRooms) || ok {
		t.Fatalf("the fourth join: %v, %v, want ErrTooManyRooms", ok, err)
	}
	if n, v := tb.Count("r3"); n != 0 || v != 0 {
		t.Fatalf("Count(r3) after a refusal = %d, %d, want 0, 0", n, v)
	}
	if got := tb.DeviceRooms(1, "phone", nil); len(got) != 3 {
		t.Fatalf("DeviceRooms after a refusal = %v", got)
	}
	if after := tb.Stats(); after != before {
		t.Fatalf("Stats after a refusal = %+v, want %+v", after, before)
	}
	if _, _, err := tb.Join(1, "ann", "phone", "r1", true, 2); err != nil {
		t.Fatalf("a join of a room the device is in already: %v, want a no-op", err)
	}
	if _, ok, err := tb.Join(1, "ann", "laptop", "r3", true, 2); !ok || err != nil {
		t.Fatalf("another device: %v, %v", ok, err)
	}
	tb.Leave(1, "phone", "r0", presence.ReasonLeft, 3)
	if _, _, err := tb.Join(1, "ann", "phone", "r3", true, 4); err != nil {
		t.Fatalf("a join after a leave: %v", err)
	}
}

// TestMaxRoomsDefault: the zero Config takes presence.DefaultMaxRooms.
func TestMaxRoomsDefault(t *testing.T) {
	tb := newHarness(Config{})
	var err error
	n := 0
	for ; err == nil; n++ {
		_, _, err = tb.Join(1, "ann", "phone", fmt.Sprint("r", n), true, 1)
	}
	if n-1 != presence.DefaultMaxRooms || !errors.Is(err, presence.ErrTooManyRooms) {
		t.Fatalf("joined %d rooms, then %v; want %d, then ErrTooManyRooms", n-1, err, presence.DefaultMaxRooms)
	}
}

// TestVersionsNeverRepeat: a room emptied and made again goes on above
// the versions it had, and the first is above Epoch<<32.
func TestVersionsNeverRepeat(t *testing.T) {
	tb := newHarness(Config{Epoch: 3, Shards: 1})
	var last uint64
	for i := range 5 {
		ev, _, _ := tb.Join(1, "ann", "phone", "doc", true, 1)
		if ev.Version <= 3<<32 || ev.Version <= last {
			t.Fatalf("round %d: join version %d, want above %d and %d", i, ev.Version, uint64(3)<<32, last)
		}
		ev2, _ := tb.Leave(1, "phone", "doc", presence.ReasonLeft, 2)
		if ev2.Version != ev.Version+1 || ev2.Count != 0 {
			t.Fatalf("round %d: leave %+v after join version %d", i, ev2, ev.Version)
		}
		if n, v := tb.Count("doc"); n != 0 || v != 0 {
			t.Fatalf("an emptied room counts %d, %d", n, v)
		}
		last = ev2.Version
	}
	if st := tb.Stats(); st.Rooms != 0 || st.DeviceRooms != 0 {
		t.Fatalf("Stats of an empty table: %+v", st)
	}
}

// TestInvisibleIsAbsent: an invisible user's devices keep it out of the
// count, the pages and the versions, and only its coming back is an event.
func TestInvisibleIsAbsent(t *testing.T) {
	tb := newHarness(Config{})
	if _, ok, _ := tb.Join(1, "ann", "phone", "doc", false, 1); ok {
		t.Fatal("an invisible user's join is an event")
	}
	if n, v := tb.Count("doc"); n != 0 || v != 0 {
		t.Fatalf("Count with an invisible user = %d, %d, want 0, 0", n, v)
	}
	if got, _, v, more := tb.Page("doc", "", 10, nil); len(got) != 0 || v != 0 || more {
		t.Fatalf("Page with an invisible user = %v, %d, %v", got, v, more)
	}
	evs := tb.SetCounted(1, true, 2, nil)
	if len(evs) != 1 || evs[0].Kind != presence.RoomJoin || evs[0].Reason != presence.ReasonVisible || evs[0].Count != 1 {
		t.Fatalf("coming back: %+v", evs)
	}
	// A second device of a member is silent, and so is the first leaving.
	if _, ok, _ := tb.Join(1, "ann", "laptop", "doc", true, 3); ok {
		t.Fatal("a second device's join is an event")
	}
	if _, ok := tb.Leave(1, "phone", "doc", presence.ReasonLeft, 4); ok {
		t.Fatal("a leave of one of two devices is an event")
	}
	evs = tb.LeaveAll(1, "laptop", presence.ReasonEnded, 5, nil)
	if len(evs) != 1 || evs[0].Reason != presence.ReasonEnded || evs[0].Count != 0 || evs[0].UserID != "ann" || evs[0].Room != "doc" {
		t.Fatalf("the last device ended: %+v", evs)
	}
	if tb.InRooms(1) {
		t.Fatal("a user without devices in rooms is InRooms")
	}
}

// TestConcurrent: goroutines, each with users of its own, join and leave
// shared rooms while others read counts and pages; the final counts are
// exact. Run with -race.
func TestConcurrent(t *testing.T) {
	const (
		workers = 8
		users   = 50
		rooms   = 12
		steps   = 3000
	)
	tb := newHarness(Config{Shards: 4, Rules: presence.RoomRules{MaxRooms: rooms}})
	members := make([][rooms]int, workers) // per worker, per room: its members
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			in := map[[2]int]bool{} // (user, room) → the device is in it
			counted := map[int]bool{}
			var out []presence.RoomEvent
			for range steps {
				i, r := rng.IntN(users), rng.IntN(rooms)
				u := UserRef(w*users + i)
				room := fmt.Sprint("room-", r)
				switch rng.IntN(8) {
				case 0, 1, 2, 3:
					if _, _, err := tb.Join(u, fmt.Sprint("user-", u), "d", room, true, 1); err != nil {
						t.Error(err)
						return
					}
					in[[2]int{i, r}] = true
				case 4, 5:
					tb.Leave(u, "d", room, presence.ReasonLeft, 1)
					delete(in, [2]int{i, r})
				case 6:
					out = tb.LeaveAll(u, "d", presence.ReasonBye, 1, out[:0])
					for k := range in {
						if k[0] == i {
							delete(in, k)
						}
					}
				default:
					c := rng.IntN(2) == 0
					tb.SetCounted(u, c, 1, out[:0])
					counted[i] = c
				}
				if !tb.InRooms(u) {
					delete(counted, i) // a user with no rooms is counted again on its next join
				}
			}
			for k := range in {
				if c, ok := counted[k[0]]; !ok || c {
					members[w][k[1]]++
				}
			}
		})
	}
	stop := make(chan struct{})
	var readers sync.WaitGroup
	readers.Go(func() {
		var page []string
		for {
			select {
			case <-stop:
				return
			default:
			}
			for r := range rooms {
				tb.Count(fmt.Sprint("room-", r))
				page, _, _, _ = tb.Page(fmt.Sprint("room-", r), "user-1", 10, page[:0])
			}
			tb.Stats()
		}
	})
	wg.Wait()
	close(stop)
	readers.Wait()
	total := 0
	for r := range rooms {
		want := 0
		for w := range workers {
			want += members[w][r]
		}
		total += want
		if n, _ := tb.Count(fmt.Sprint("room-", r)); n != want {
			t.Errorf("room-%d counts %d, want %d", r, n, want)
		}
		page, _, _, _ := tb.Page(fmt.Sprint("room-", r), "", users*workers, nil)
		if len(page) != want {
			t.Errorf("room-%d lists %d members, want %d", r, len(page), want)
		}
	}
	if st := tb.Stats(); st.Memberships != total {
		t.Errorf("Stats.Memberships = %d, want %d", st.Memberships, total)
	}
}

// An invisible user's device keeps an emptied room's record, yet the
// room's next version is what it would be without it: the versions do not
// tell that someone invisible is in the room.
func TestInvisibleDeviceHidesInVersions(t *testing.T) {
	next := func(invisible bool) uint64 {
		tb := newHarness(Config{Shards: 1, Epoch: 3})
		mustJoin := func(u UserRef, user, room string, counted bool) presence.RoomEvent {
			ev, _, err := tb.Join(u, user, "d", room, counted, 1)
			if err != nil {
				t.Fatal(err)
			}
			return ev
		}
		mustJoin(1, "ann", "r", true)
		if invisible {
			mustJoin(2, "ivy", "r", false)
		}
		for range 5 { // other's versions run ahead of r's
			mustJoin(1, "ann", "other", true)
			tb.Leave(1, "d", "other", presence.ReasonLeft, 2) // and raise the shard's floor
		}
		tb.Leave(1, "d", "r", presence.ReasonLeft, 3)
		if n, v := tb.Count("r"); n != 0 || v != 0 {
			t.Fatalf("an emptied room reads %d members at version %d", n, v)
		}
		return mustJoin(3, "bob", "r", true).Version
	}
	if with, without := next(true), next(false); with != without {
		t.Fatalf("the join after the room emptied: version %d with an invisible device in it, %d without", with, without)
	}
}
