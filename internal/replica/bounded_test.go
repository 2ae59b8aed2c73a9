package replica

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
)

// bounded runs a replica of at most max users and waits for it to
// answer.
func bounded(t *testing.T, src *source, max int) *Replica {
	t.Helper()
	r := run(t, Config{Source: src, Max: max})
	awaitReady(t, r)
	return r
}

// expect checks that r reads id at status st, version v.
func expect(t *testing.T, r *Replica, id string, st presence.Status, v uint64) {
	t.Helper()
	if got := get(t, r, id)[0]; got.Status != st || got.Version != v {
		t.Errorf("%s = %v v%d, want %v v%d", id, got.Status, got.Version, st, v)
	}
}

// sameShard returns n ids that r places in one shard.
func sameShard(r *Replica, n int) []string {
	var ids []string
	want, _ := r.locate("s0")
	for i := 0; len(ids) < n; i++ {
		id := "s" + strconv.Itoa(i)
		if s, _ := r.locate(id); s == want {
			ids = append(ids, id)
		}
	}
	return ids
}

func TestBoundedReadsThroughOnce(t *testing.T) {
	src := &source{}
	src.set("a", presence.Online, 5)
	src.set("b", presence.Away, 7)
	r := bounded(t, src, 1000)
	if src.scans.Load() != 0 {
		t.Errorf("a bounded replica scanned the store %d times", src.scans.Load())
	}
	for round := range 2 {
		got := get(t, r, "a", "b", "nobody")
		if got[0].Status != presence.Online || got[0].Version != 5 || !got[0].Known ||
			got[1].Status != presence.Away || got[1].Version != 7 ||
			got[2].Known || got[2].Version != 1 {
			t.Fatalf("round %d: %+v", round, got)
		}
	}
	if n := src.reads.Load(); n != 3 {
		t.Errorf("the store read %d users for two reads of three, want 3 (the second from memory, unknown users too)", n)
	}
	if st := r.Stats(); st.Misses != 3 || st.Users != 3 || st.Served != 2 {
		t.Errorf("stats %+v, want 3 misses, 3 users, 2 served", st)
	}
}

func TestBoundedKeepsChanges(t *testing.T) {
	src := &source{}
	src.set("a", presence.Online, 5)
	r := bounded(t, src, 1000)
	get(t, r, "a")
	r.Publish(ev("a", presence.Busy, 6))
	r.Publish(ev("a", presence.Away, 4)) // older: ignored
	expect(t, r, "a", presence.Busy, 6)
	// A change of a user not held is kept while there is room.
	r.Publish(ev("c", presence.Away, 9))
	expect(t, r, "c", presence.Away, 9)
	if n := src.reads.Load(); n != 1 {
		t.Errorf("the store read %d users, want 1", n)
	}
}

// A change that arrives while the store is read is newer than the read,
// whichever order the two reach the replica in.
func TestBoundedChangeDuringTheReadWins(t *testing.T) {
	src := &source{}
	src.set("a", presence.Online, 5)
	r := bounded(t, src, 1000)
	src.during = func() { r.Publish(ev("a", presence.Busy, 6)) }
	expect(t, r, "a", presence.Busy, 6)
	src.during = nil
	expect(t, r, "a", presence.Busy, 6)
	if n := src.reads.Load(); n != 1 {
		t.Errorf("the store read %d users, want 1", n)
	}
}

// A full replica evicts, in the shard that needs a slot, a user no read
// asked for since the hand last passed, never makes room for a change,
// and answers a read through it anyway.
func TestBoundedEvictsTheUnread(t *testing.T) {
	src := &source{}
	r := bounded(t, src, 2)
	ids := sameShard(r, 4)
	for _, id := range ids {
		src.set(id, presence.Online, 3)
	}
	get(t, r, ids[0])
	get(t, r, ids[1])
	get(t, r, ids[0]) // ids[0] read again: marked
	get(t, r, ids[2]) // evicts ids[1]
	if st := r.Stats(); st.Evicted != 1 || st.Users != 2 {
		t.Fatalf("stats %+v, want 1 evicted, 2 users", st)
	}
	before := src.reads.Load()
	get(t, r, ids[0])
	get(t, r, ids[2])
	if n := src.reads.Load() - before; n != 0 {
		t.Errorf("the store read %d users held", n)
	}
	get(t, r, ids[1])
	if n := src.reads.Load() - before; n != 1 {
		t.Errorf("the evicted user was read %d times from the store, want 1", n)
	}
	r.Publish(ev(ids[3], presence.Away, 8))
	if st := r.Stats(); st.NotHeld != 1 || st.Evicted != 2 {
		t.Errorf("stats %+v, want the change of a user not held skipped and nothing more evicted", st)
	}
}

// Users held longer than Every are read again in the background, and
// reads answer from memory meanwhile.
func TestBoundedRefreshesTheOld(t *testing.T) {
	src := &source{}
	src.set("a", presence.Online, 5)
	src.set("b", presence.Online, 5)
	// Without Run: the test refreshes, and moves the replica's clock.
	r, err := New(Config{Source: src, Max: 1000})
	if err != nil {
		t.Fatal(err)
	}
	<-r.wake
	r.empty()
	r.filled.Store(r.asked.Load())
	get(t, r, "a")
	// A change this replica never got (its publisher dropped it).
	src.set("a", presence.Away, 6)
	r.start = r.start.Add(-10 * time.Minute) // a's read is ten minutes old
	get(t, r, "b")                           // b's is new
	if got := get(t, r, "a")[0]; got.Status != presence.Online {
		t.Fatalf("a = %v, want online: answered from memory however old", got.Status)
	}
	for i := range r.shards {
		if err := r.refresh(context.Background(), &r.shards[i]); err != nil {
			t.Fatal(err)
		}
	}
	expect(t, r, "a", presence.Away, 6)
	if st := r.Stats(); st.Refreshed != 1 || st.Misses != 2 {
		t.Errorf("stats %+v, want 1 user refreshed (a, not b), 2 misses", st)
	}
	for i := range r.shards { // a was just read again: nothing is old
		if err := r.refresh(context.Background(), &r.shards[i]); err != nil {
			t.Fatal(err)
		}
	}
	if st := r.Stats(); st.Refreshed != 1 {
		t.Errorf("%d users refreshed, want 1", st.Refreshed)
	}
}

func TestBoundedRefillEmpties(t *testing.T) {
	src := &source{}
	src.set("a", presence.Online, 5)
	r := bounded(t, src, 1000)
	get(t, r, "a")
	src.set("a", presence.Away, 6)
	r.Refill()
	awaitReady(t, r)
	if got := get(t, r, "a")[0]; got.Status != presence.Away {
		t.Errorf("a = %v after a Refill, want away: read from the store again", got.Status)
	}
	if st := r.Stats(); st.Fills != 2 || st.Misses != 2 {
		t.Errorf("stats %+v, want emptied twice (start, Refill) and 2 misses", st)
	}
}

// A read that began before a Refill answers what it read but keeps none
// of it: the replica may have missed changes since the read's slots were
// made.
func TestBoundedReadDuringARefillKeepsNothing(t *testing.T) {
	src := &source{}
	src.set("a", presence.Online, 5)
	r := bounded(t, src, 1000)
	src.during = r.Refill
	if got := get(t, r, "a")[0]; got.Status != presence.Online {
		t.Errorf("a = %v, want online: what the store answered", got.Status)
	}
	src.during = nil
	awaitReady(t, r)
	get(t, r, "a")
	if n := src.reads.Load(); n != 2 {
		t.Errorf("the store read %d users, want 2: the first read kept nothing", n)
	}
}

// Two ids of one hash: the first is held, the second read from the
// store each time; neither shows the other's state.
func TestHashCollision(t *testing.T) {
	src := &source{}
	src.set("a", presence.Online, 5)
	src.set("b", presence.Away, 7)
	r := bounded(t, src, 1000)
	get(t, r, "a")
	// Make b's key a's: move a's slot under b's hash.
	sa, ha := r.locate("a")
	sb, hb := r.locate("b")
	sa.mu.Lock()
	i := sa.m[ha]
	delete(sa.m, ha)
	sa.mu.Unlock()
	sb.mu.Lock()
	if sa != sb {
		sb.slots = append(sb.slots, sa.slots[i])
		i = int32(len(sb.slots) - 1)
	}
	sb.m[hb] = i
	sb.mu.Unlock()
	for range 2 {
		if got := get(t, r, "b")[0]; got.Status != presence.Away || got.Version != 7 {
			t.Fatalf("b = %v v%d, want away v7 (read from the store, not a's slot)", got.Status, got.Version)
		}
	}
	if n := src.reads.Load(); n != 3 {
		t.Errorf("the store read %d users, want 3: b twice", n)
	}
	r.Publish(ev("b", presence.Busy, 8)) // not held: a's slot is untouched
	sb.mu.RLock()
	held := sb.slots[sb.m[hb]]
	sb.mu.RUnlock()
	if !held.is("a") || held.e.version != 5 {
		t.Errorf("a's slot holds %q v%d after b's change, want a v5", held.name(), held.e.version)
	}
}

// A store that hangs fails a read through it within ReadTimeout: the
// caller then reads the store its own way (the tracker's degraded reads).
func TestBoundedReadOfAHungStore(t *testing.T) {
	src := &source{}
	src.set("a", presence.Online, 5)
	r := run(t, Config{Source: src, Max: 1000, ReadTimeout: 50 * time.Millisecond})
	awaitReady(t, r)
	src.hang.Store(true)
	out := make([]presence.Snapshot, 1)
	done := make(chan error, 1)
	go func() { done <- r.Get(context.Background(), 0, []string{"a"}, out) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Get of a hung store: %v, want its deadline exceeded", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Get of a hung store did not return")
	}
}

func TestBoundedReadFails(t *testing.T) {
	src := &source{}
	src.set("a", presence.Online, 5)
	r := bounded(t, src, 1000)
	src.fail = errors.New("redis down")
	out := make([]presence.Snapshot, 1)
	if err := r.Get(context.Background(), 0, []string{"a"}, out); err == nil {
		t.Fatal("Get answered with the store down")
	}
	if st := r.Stats(); st.Users != 0 {
		t.Errorf("%d users held after a failed read, want 0: a slot made for it is freed", st.Users)
	}
	src.fail = nil
	if got := get(t, r, "a")[0]; got.Status != presence.Online {
		t.Errorf("a = %v, want online", got.Status)
	}
}

// Readers, writers and Refills at once on a small replica: the bound
// holds, and the race detector sees nothing.
func TestBoundedConcurrentUse(t *testing.T) {
	src := &source{}
	const users = 500
	for i := range users {
		src.set(fmt.Sprint("u", i), presence.Online, 1)
	}
	r := bounded(t, src, 4*numShards)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 4 {
		wg.Go(func() {
			ids := make([]string, 20)
			out := make([]presence.Snapshot, len(ids))
			for v := uint64(2); ; v++ {
				select {
				case <-stop:
					return
				default:
				}
				for i := range ids {
					ids[i] = fmt.Sprint("u", (int(v)*7+i*13+g)%users)
				}
				id := fmt.Sprint("u", (int(v)+g*100)%users)
				src.set(id, presence.Away, v)
				r.Publish(ev(id, presence.Away, v))
				_ = r.Get(context.Background(), 0, ids, out)
				if v%97 == 0 {
					r.Refill()
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	if st := r.Stats(); st.Users > 4*numShards {
		t.Errorf("%d users held, bound %d", st.Users, 4*numShards)
	}
}
