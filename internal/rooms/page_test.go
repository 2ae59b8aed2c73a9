package rooms

import (
	"cmp"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/presenced/presenced/internal/presence"
)

// sortedMembers returns ids in the order of the pages.
func sortedMembers(ids map[string]bool) []string {
	out := make([]string, 0, len(ids))
	for id := range ids {
		out = append(out, id)
	}
	slices.SortFunc(out, func(a, b string) int {
		return cmp.Or(cmp.Compare(orderHash(a), orderHash(b)), strings.Compare(a, b))
	})
	return out
}

// chunks returns the chunks of room and their lengths.
func (t *Table) chunks(room string) []int {
	for i := range t.rooms {
		rs := &t.rooms[i]
		for ri := range rs.rooms {
			r := &rs.rooms[ri]
			if r.devs == 0 || rs.str(r.idOff) != room || r.nchunks == 0 {
				continue
			}
			var ns []int
			for _, d := range rs.slab.block(r.dir)[:r.nchunks] {
				ns = append(ns, int(uint32(d)))
			}
			return ns
		}
	}
	return nil
}

// TestRoomGrowsAndShrinks fills one room with thousands of members in a
// random order and empties it in another, checking its pages and that
// its chunks stay few (splits, merges, shrinking chunks and directory)
// on the way.
func TestRoomGrowsAndShrinks(t *testing.T) {
	const n = 5000
	tb := newHarness(Config{Shards: 1})
	rng := rand.New(rand.NewPCG(1, 2))
	in := map[string]bool{}
	check := func(what string) {
		t.Helper()
		want := sortedMembers(in)
		var got []string
		after := ""
		for more := true; more; {
			got, _, _, more = tb.Page("doc", after, 97, got)
			if len(got) > 0 {
				after = got[len(got)-1]
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%s: pages list %d members, want %d (or another order)", what, len(got), len(want))
		}
		ns := tb.chunks("doc")
		if len(ns) > 4*len(in)/chunkMax+1 {
			t.Fatalf("%s: %d members in %d chunks %v", what, len(in), len(ns), ns)
		}
		for i := 1; i < len(ns); i++ {
			if ns[i-1]+ns[i] <= chunkMax/2 {
				t.Fatalf("%s: neighbour chunks of %d and %d members", what, ns[i-1], ns[i])
			}
		}
	}
	perm := rng.Perm(n)
	for i, k := range perm {
		id := fmt.Sprint("user-", k)
		if _, ok, err := tb.Join(UserRef(k), id, "d", "doc", true, 1); !ok || err != nil {
			t.Fatalf("join of %s: %v, %v", id, ok, err)
		}
		in[id] = true
		if i%500 == 0 {
			check(fmt.Sprintf("after %d joins", i+1))
		}
	}
	check("full")
	for i, k := range rng.Perm(n) {
		id := fmt.Sprint("user-", k)
		ev, ok := tb.Leave(UserRef(k), "d", "doc", presence.ReasonLeft, 2)
		if !ok || ev.UserID != id || ev.Count != n-i-1 {
			t.Fatalf("leave of %s: %+v, %v", id, ev, ok)
		}
		delete(in, id)
		if i%500 == 0 || n-i < 100 {
			check(fmt.Sprintf("after %d leaves", i+1))
		}
	}
	if st := tb.Stats(); st != (fullStats{Bytes: st.Bytes}) {
		t.Fatalf("Stats of an emptied table: %+v", st)
	}
	// Fill again, thin every stretch of the order to a tenth (chunks
	// shrink, then merge into shrunk neighbours) and empty it.
	for _, k := range perm {
		id := fmt.Sprint("user-", k)
		tb.Join(UserRef(k), id, "d", "doc", true, 3)
		in[id] = true
	}
	ids := sortedMembers(in)
	byID := map[string]int{}
	for _, k := range perm {
		byID[fmt.Sprint("user-", k)] = k
	}
	for pass := range 2 {
		for i, id := range ids {
			if (i%10 != 0) == (pass == 0) {
				tb.Leave(UserRef(byID[id]), "d", "doc", presence.ReasonLeft, 4)
				delete(in, id)
				if i%250 == 0 {
					check(fmt.Sprintf("pass %d, at %d", pass, i))
				}
			}
		}
		check(fmt.Sprintf("after pass %d", pass))
	}
	if st := tb.Stats(); st != (fullStats{Bytes: st.Bytes}) {
		t.Fatalf("Stats of a table emptied again: %+v", st)
	}
}

// TestPageWhileChanging pages through a large room while other users join
// and leave between pages: every member present throughout is listed
// exactly once, no one is listed twice, and the pages keep their order.
func TestPageWhileChanging(t *testing.T) {
	const stable, churn = 3000, 3000
	tb := newHarness(Config{Shards: 2})
	rng := rand.New(rand.NewPCG(5, 6))
	for k := range stable {
		tb.Join(UserRef(k), fmt.Sprint("stay-", k), "d", "doc", true, 1)
	}
	in := map[int]bool{}
	for round := range 5 {
		seen := map[string]int{}
		var page []string
		after, prev := "", ""
		for more := true; more; {
			page, _, _, more = tb.Page("doc", after, 1+rng.IntN(150), page[:0])
			for _, id := range page {
				if prev != "" && cmp.Or(cmp.Compare(orderHash(prev), orderHash(id)), strings.Compare(prev, id)) >= 0 {
					t.Fatalf("round %d: %q listed after %q", round, id, prev)
				}
				prev = id
				seen[id]++
			}
			if len(page) > 0 {
				after = page[len(page)-1]
			}
			// Others come and go between pages, before and after the cursor.
			for range 40 {
				k := stable + rng.IntN(churn)
				if in[k] {
					tb.Leave(UserRef(k), "d", "doc", presence.ReasonLeft, 2)
					delete(in, k)
				} else {
					tb.Join(UserRef(k), fmt.Sprint("come-", k), "d", "doc", true, 2)
					in[k] = true
				}
			}
		}
		for k := range stable {
			if id := fmt.Sprint("stay-", k); seen[id] != 1 {
				t.Fatalf("round %d: %s listed %d times", round, id, seen[id])
			}
		}
		for id, c := range seen {
			if c != 1 {
				t.Fatalf("round %d: %s listed %d times", round, id, c)
			}
		}
	}
}

// TestPageCost: a page of a room of 100,000 costs a binary search, not a
// walk of the members before it.
func TestPageCost(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a room of 100,000")
	}
	tb, uids, rids := population(100_000, 1)
	rs := &tb.rooms[maphash.String(tb.seed, rids[0])&tb.mask]
	rng := rand.New(rand.NewPCG(3, 4))
	var page []string
	for range 100 {
		before := rs.compares
		var more bool
		page, _, _, more = tb.Page(rids[0], uids[rng.IntN(len(uids))], 100, page[:0])
		if n := rs.compares - before; n > 40 {
			t.Fatalf("a page compared %d order keys, want at most 40", n)
		}
		if len(page) != 100 && more {
			t.Fatalf("a page of %d members, and more", len(page))
		}
	}
}
