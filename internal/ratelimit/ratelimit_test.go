package ratelimit

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// step is one Take at a time (Unix ms) and what it must answer.
type step struct {
	at   int64
	ok   bool
	wait int64
}

func TestBucket(t *testing.T) {
	tests := []struct {
		name  string
		limit Limit
		steps []step
	}{
		{"status: a burst of 5, then 1 a second", Status, []step{
			{0, true, 0}, {0, true, 0}, {0, true, 0}, {0, true, 0}, {0, true, 0},
			{0, false, 1000}, {999, false, 1}, {1000, true, 0}, {1000, false, 1000},
			{2500, true, 0}, {2500, false, 500},
			// Quiet for long: the bucket is full again, and no fuller.
			{60_000, true, 0}, {60_000, true, 0}, {60_000, true, 0}, {60_000, true, 0}, {60_000, true, 0},
			{60_000, false, 1000},
		}},
		{"20 a second, bursts of 2", PerSecond(20, 2), []step{
			{0, true, 0}, {0, true, 0}, {0, false, 50}, {49, false, 1}, {50, true, 0}, {50, false, 50},
		}},
		{"once per 30s", Limit{Every: 30 * time.Second, Burst: 1}, []step{
			{0, true, 0}, {1, false, 29_999}, {30_000, true, 0}, {59_000, false, 1000},
		}},
		{"off", Limit{}, []step{{0, true, 0}, {0, true, 0}, {0, true, 0}}},
		{"a clock that goes back", Status, []step{
			{10_000, true, 0}, {10_000, true, 0}, {10_000, true, 0}, {10_000, true, 0}, {10_000, true, 0},
			{9_000, false, 2000}, {11_000, true, 0},
		}},
	}
	for _, tc := range tests {
		var b Bucket
		k := NewKeyed(tc.limit)
		for i, s := range tc.steps {
			if ok, wait := b.Take(s.at, tc.limit); ok != s.ok || wait != s.wait {
				t.Errorf("%s: Bucket step %d (at %d ms): got %v, %d ms; want %v, %d ms", tc.name, i, s.at, ok, wait, s.ok, s.wait)
			}
			if ok, wait := k.Take("u", s.at); ok != s.ok || wait != s.wait {
				t.Errorf("%s: Keyed step %d (at %d ms): got %v, %d ms; want %v, %d ms", tc.name, i, s.at, ok, wait, s.ok, s.wait)
			}
		}
	}
}

// TestKeyedPerKey: each key has its own bucket.
func TestKeyedPerKey(t *testing.T) {
	k := NewKeyed(Status)
	for range Status.Burst {
		if ok, _ := k.Take("a", 0); !ok {
			t.Fatal("a's burst refused")
		}
	}
	if ok, _ := k.Take("a", 0); ok {
		t.Fatal("a beyond its burst: admitted")
	}
	if ok, _ := k.Take("b", 0); !ok {
		t.Fatal("b refused for a's burst")
	}
}

// TestKeyedMemory: buckets that filled up again are dropped, so a stream
// of new keys holds only the keys of the last burst's worth of time.
func TestKeyedMemory(t *testing.T) {
	k := NewKeyed(Status) // a bucket is full 1 s after one take
	const n = 100_000
	for round := range int64(5) {
		now := round * 10_000
		for i := range n {
			k.Take(fmt.Sprintf("r%d-%d", round, i), now)
		}
	}
	// The last round's keys, and at most a shard's prune threshold of the
	// round before in each shard.
	if got := k.Len(); got > 2*n {
		t.Errorf("%d buckets held after 5 rounds of %d new keys, want at most %d", got, n, 2*n)
	}
}

func TestKeyedConcurrent(t *testing.T) {
	k := NewKeyed(Status)
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := map[string]int{}
	for range 8 {
		wg.Go(func() {
			for i := range 100 {
				key := fmt.Sprint(i % 10)
				if ok, _ := k.Take(key, 0); ok {
					mu.Lock()
					admitted[key]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for key, n := range admitted {
		if n != Status.Burst {
			t.Errorf("key %s: %d admitted at one instant, want the burst, %d", key, n, Status.Burst)
		}
	}
}

func TestLimitString(t *testing.T) {
	for _, tc := range []struct {
		l    Limit
		want string
	}{
		{Status, "at most 1 per second, bursts of 5"},
		{PerSecond(20, 40), "at most 20 per second, bursts of 40"},
		{Limit{Every: 30 * time.Second, Burst: 1}, "at most 1 per 30s"},
		{PerSecond(3, 3), "at most 3 per second, bursts of 3"},
		{Limit{Every: 400 * time.Millisecond, Burst: 1}, "at most 2.5 per second"},
		{Limit{}, "unlimited"},
	} {
		if got := tc.l.String(); got != tc.want {
			t.Errorf("%+v.String() = %q, want %q", tc.l, got, tc.want)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	for _, tc := range []struct{ ms, want int64 }{{0, 1}, {1, 1}, {999, 1}, {1000, 1}, {1001, 2}, {29_999, 30}} {
		if got := RetryAfter(tc.ms); got != tc.want {
			t.Errorf("RetryAfter(%d) = %d, want %d", tc.ms, got, tc.want)
		}
	}
}

// TestTakeAllocs: taking a token allocates nothing (a known key's bucket,
// and a connection's own).
func TestTakeAllocs(t *testing.T) {
	k := NewKeyed(Status)
	k.Take("u", 0)
	var b Bucket
	now := int64(0)
	if n := testing.AllocsPerRun(100, func() {
		now += 1000
		k.Take("u", now)
		b.Take(now, Status)
	}); n != 0 {
		t.Errorf("Take: %v allocations, want 0", n)
	}
}

// TestKeyedTakeN: n tokens at once or none; Give puts back what an
// operation did not use, never beyond full.
func TestKeyedTakeN(t *testing.T) {
	l := Snapshots(500) // bursts of 1,000, 100 a second: 10 ms a token
	k := NewKeyed(l)
	for i, s := range []struct {
		n, give int
		at      int64
		ok      bool
		wait    int64
	}{
		{n: 600, at: 0, ok: true},
		{n: 500, at: 0, ok: false, wait: 1000}, // 400 left: 100 more take 1 s
		{n: 400, at: 0, ok: true},
		{n: 1, at: 0, ok: false, wait: 10},
		{give: 300, at: 0},
		{n: 300, at: 0, ok: true},
		{n: 100, at: 1000, ok: true},            // refilled 100 in a second
		{n: 1001, at: 1e6, ok: false, wait: -1}, // more than a burst: never
		{give: 5000, at: 1e6},                   // beyond full: nothing to give back
		{n: 1000, at: 1e6, ok: true},
		{n: 0, at: 1e6, ok: true},
	} {
		if s.give > 0 {
			k.Give("u", s.give, s.at)
			continue
		}
		if ok, wait := k.TakeN("u", s.n, s.at); ok != s.ok || wait != s.wait {
			t.Errorf("step %d: TakeN(%d) at %d ms: got %v, %d ms; want %v, %d ms", i, s.n, s.at, ok, wait, s.ok, s.wait)
		}
	}
	// A bucket given back in full is forgotten.
	k = NewKeyed(l)
	k.TakeN("v", 10, 0)
	k.Give("v", 10, 0)
	if n := k.Len(); n != 0 {
		t.Errorf("%d buckets after a full give-back, want 0", n)
	}
	if allocs := testing.AllocsPerRun(100, func() { k.TakeN("w", 1, 0); k.Give("w", 1, 0) }); allocs != 0 {
		t.Errorf("TakeN and Give allocate %v times", allocs)
	}
}

// TestRooms: a device rejoins its 100 rooms twice at once, then gets one
// join or leave every 100 ms.
func TestRooms(t *testing.T) {
	const now = int64(1_795_388_929_123)
	var b Bucket
	for i := range 200 {
		if ok, wait := b.Take(now, Rooms); !ok {
			t.Fatalf("take %d of the burst of 200: refused, wait %d ms", i+1, wait)
		}
	}
	if ok, wait := b.Take(now, Rooms); ok || wait != 100 {
		t.Fatalf("take 201 at the same instant: got %v, %d ms; want refused, 100 ms", ok, wait)
	}
	if ok, wait := b.Take(now+100, Rooms); !ok {
		t.Fatalf("100 ms later: refused, wait %d ms", wait)
	}
	if ok, _ := b.Take(now+100, Rooms); ok {
		t.Fatal("a second take 100 ms later: admitted")
	}
	if got, want := Rooms.String(), "at most 10 per second, bursts of 200"; got != want {
		t.Errorf("Rooms.String() = %q, want %q", got, want)
	}
}
