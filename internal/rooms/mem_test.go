package rooms

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/presenced/presenced/internal/presence"
)

// fill joins users users, each with one device, to perUser rooms each
// out of rooms (user i to rooms (i*perUser+k) mod rooms), every id 12
// bytes, and returns the heap the table holds per membership.
func fill(t testing.TB, users, perUser, rooms int) (perMembership float64, st fullStats) {
	uids := make([]string, users)
	for i := range uids {
		uids[i] = fmt.Sprintf("u%011d", i)
	}
	rids := make([]string, rooms)
	for i := range rids {
		rids[i] = fmt.Sprintf("r%011d", i)
	}
	const dev = "phone-000001"
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	// The user side as memstore keeps it: one Users per shard of 256.
	tb, uss := New(Config{}), make([]Users, 256)
	for i := range users {
		us, ui := &uss[i%len(uss)], uint32(i/len(uss))
		for k := range perUser {
			if _, ok, err := tb.Join(us, ui, uids[i], dev, rids[(i*perUser+k)%rooms], true, 1); !ok || err != nil {
				t.Fatalf("join: %v, %v", ok, err)
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	st = fullStats{Bytes: tb.Stats().Bytes}
	for i := range uss {
		u := uss[i].Stats()
		st.Members += u.Members
		st.DeviceRooms += u.DeviceRooms
		st.Bytes += u.Bytes
	}
	rst := tb.Stats()
	st.Rooms, st.Memberships = rst.Rooms, rst.Memberships
	m := users * perUser
	if st.Memberships != m || st.Rooms != rooms || st.Members != users || st.DeviceRooms != m {
		t.Fatalf("Stats = %+v, want %d memberships in %d rooms", st, m, rooms)
	}
	if n, _ := tb.Count(rids[rooms/2]); n != m/rooms {
		t.Fatalf("a room counts %d, want %d", n, m/rooms)
	}
	runtime.KeepAlive(tb)
	runtime.KeepAlive(uss)
	runtime.KeepAlive(uids)
	runtime.KeepAlive(rids)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(m), st
}

// TestMembershipBytes: a million memberships cost at most 64 bytes each
// on the heap, both as a million users with one device in one room each
// and as 100,000 users with one device in 10 rooms each (rooms of 100 in
// both). The bytes are the table's: the users' own records, which the
// caller keeps, are not in them.
func TestMembershipBytes(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("fills a million memberships, and counts bytes")
	}
	for _, c := range []struct {
		users, perUser int
		name           string
	}{
		{1_000_000, 1, "1,000,000 users × 1 device × 1 room"},
		{100_000, 10, "100,000 users × 1 device × 10 rooms"},
	} {
		per, st := fill(t, c.users, c.perUser, 10_000)
		t.Logf("%s (rooms of 100): %.1f B per membership (Stats.Bytes %.1f)", c.name, per, float64(st.Bytes)/float64(st.Memberships))
		if per > 64 {
			t.Errorf("%s: %.1f B per membership, want at most 64", c.name, per)
		}
	}
}

// population is a table of users users in rooms rooms, one device and one
// room each, and the ids it used.
func population(users, rooms int) (*harness, []string, []string) {
	tb := newHarness(Config{})
	uids := make([]string, users)
	for i := range uids {
		uids[i] = fmt.Sprintf("u%011d", i)
	}
	rids := make([]string, rooms)
	for i := range rids {
		rids[i] = fmt.Sprintf("r%011d", i)
	}
	for i := range users {
		tb.Join(UserRef(i), uids[i], "phone", rids[i%rooms], true, 1)
	}
	return tb, uids, rids
}

// TestJoinLeaveAllocs: in a steady state, a join and a leave that change
// membership allocate nothing but, now and then, an arena's compaction
// (its new arena).
func TestJoinLeaveAllocs(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("counts allocations")
	}
	const users, rooms = 20_000, 200
	tb, uids, rids := population(users, rooms)
	step := func(i int) {
		u := UserRef(users + i%1000)
		r := rids[(i*7)%rooms]
		if _, ok, _ := tb.Join(u, uids[i%users], "laptop", r, true, 2); !ok {
			t.Fatal("no join")
		}
		if _, ok := tb.Leave(u, "laptop", r, presence.ReasonLeft, 3); !ok {
			t.Fatal("no leave")
		}
	}
	for i := range 100_000 {
		step(i)
	}
	const n = 10_000
	var before, after runtime.MemStats
	c := tb.compactions()
	runtime.ReadMemStats(&before)
	for i := range n {
		step(i)
	}
	runtime.ReadMemStats(&after)
	c = tb.compactions() - c
	if allocs := after.Mallocs - before.Mallocs; allocs > uint64(c) || c > n/50 {
		t.Errorf("%d join/leave pairs allocated %d times in %d compactions, want none but one per compaction, at most %d", n, allocs, c, n/50)
	}
	t.Logf("%d join/leave pairs: %d compactions", n, c)
}

// compactions counts the arenas' compactions so far.
func (t *Table) compactions() int {
	n := 0
	for i := range t.rooms {
		t.rooms[i].mu.Lock()
		n += t.rooms[i].compactions
		t.rooms[i].mu.Unlock()
	}
	return n
}

// BenchmarkJoinLeave: a user joins a room of a populated table (100,000
// users in 1,000 rooms of 100) and leaves it: two events.
func BenchmarkJoinLeave(b *testing.B) {
	const users, rooms = 100_000, 1_000
	tb, uids, rids := population(users, rooms)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		u := UserRef(users + i%4096)
		r := rids[(i*7)%rooms]
		tb.Join(u, uids[i%users], "laptop", r, true, 2)
		tb.Leave(u, "laptop", r, presence.ReasonLeft, 3)
		i++
	}
}

// BenchmarkCount: the count of a room of a populated table.
func BenchmarkCount(b *testing.B) {
	tb, _, rids := population(100_000, 1_000)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		tb.Count(rids[i%len(rids)])
		i++
	}
}

// BenchmarkPage100k: a page of 100 members from a random place in a room
// of 100,000.
func BenchmarkPage100k(b *testing.B) {
	tb, uids, rids := population(100_000, 1)
	rng := rand.New(rand.NewPCG(1, 1))
	out := make([]string, 0, 100)
	b.ReportAllocs()
	for b.Loop() {
		out, _, _, _ = tb.Page(rids[0], uids[rng.IntN(len(uids))], 100, out[:0])
	}
	if len(out) == 0 {
		b.Fatal("an empty page")
	}
}
