package ingestroute

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/ingest"
	"github.com/presenced/presenced/internal/jsstream"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
)

// fakeTracker records what a node's tracker was asked.
type fakeTracker struct {
	mu       sync.Mutex
	calls    []string // "beat u d" (unowned), "own <p> u d", "bye u d"
	handOffs []uint32
	fail     error
	block    chan struct{} // if set, owned beats wait for it to close
}

func (f *fakeTracker) note(s string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, s)
	return f.fail
}

func (f *fakeTracker) Heartbeat(_ context.Context, user, device string, _ bool) (presence.Change, error) {
	return presence.Change{}, f.note("beat " + user + " " + device)
}

func (f *fakeTracker) Bye(_ context.Context, user, device string) (presence.Change, error) {
	return presence.Change{}, f.note("bye " + user + " " + device)
}

func (f *fakeTracker) SourceBeat(_ context.Context, src uint32, user, device string, _, connect bool) (presence.Change, error) {
	f.mu.Lock()
	block := f.block
	f.mu.Unlock()
	if block != nil {
		<-block
	}
	if connect {
		return presence.Change{}, f.note(fmt.Sprintf("connect %d %s %s", src&^(1<<31), user, device))
	}
	return presence.Change{}, f.note(fmt.Sprintf("own %d %s %s", src&^(1<<31), user, device))
}

func (f *fakeTracker) HandOffSources(_ context.Context, srcs ...uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.handOffs = append(f.handOffs, srcs...)
	return nil
}

func (f *fakeTracker) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.calls
	f.calls = nil
	return out
}

var (
	_ ingest.Tracker   = (*Router)(nil)
	_ ingest.Connector = (*Router)(nil)
)

func TestOwnersMoveOnlyTheChangedNodesShare(t *testing.T) {
	const n = 256
	three := owners(n, []uint64{11, 22, 33})
	count := map[uint64]int{}
	for _, o := range three {
		count[o]++
	}
	for _, l := range []uint64{11, 22, 33} {
		if count[l] < n/3-30 || count[l] > n/3+30 {
			t.Errorf("lease %d owns %d of %d partitions", l, count[l], n)
		}
	}
	// 44 joins: only partitions that go to 44 move.
	four := owners(n, []uint64{11, 22, 33, 44})
	moved := 0
	for p := range three {
		if three[p] != four[p] {
			moved++
			if four[p] != 44 {
				t.Errorf("partition %d moved from %d to %d", p, three[p], four[p])
			}
		}
	}
	if moved < n/4-30 || moved > n/4+30 {
		t.Errorf("%d partitions moved to the fourth node", moved)
	}
	// 22 leaves: only its partitions move.
	two := owners(n, []uint64{11, 33})
	for p := range three {
		if three[p] != 22 && two[p] != three[p] {
			t.Errorf("partition %d of %d moved when 22 left", p, three[p])
		}
	}
	if !slices.Equal(owners(n, []uint64{33, 11, 22}), three) {
		t.Error("the owners depend on the order of the live list")
	}
}

// node is a router over a fake tracker on a shared NATS server.
type node struct {
	r     *Router
	tr    *fakeTracker
	lease atomic.Uint64
}

func newNode(t *testing.T, url string, lease uint64, live func() []uint64) *node {
	t.Helper()
	conn, err := jsstream.Dial(url, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	n := &node{tr: &fakeTracker{}}
	n.lease.Store(lease)
	n.r, err = New(Config{Conn: conn, Tracker: n.tr, Lease: n.lease.Load, Live: live, Partitions: 16,
		Timeout: 300 * time.Millisecond, Every: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = n.r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return n
}

func TestEventsReachTheirPartitionsOwner(t *testing.T) {
	srv := testsvc.NATS(t)
	var mu sync.Mutex
	live := []uint64{1, 2}
	liveNow := func() []uint64 { mu.Lock(); defer mu.Unlock(); return slices.Clone(live) }
	a, b := newNode(t, srv.URL, 1, liveNow), newNode(t, srv.URL, 2, liveNow)
	testwait.For(t, "both routers to own their shares", func() bool {
		return a.r.Stats().Owned > 0 && b.r.Stats().Owned > 0 && a.r.Stats().Owned+b.r.Stats().Owned == 16
	})
	ctx := context.Background()
	// Every user's events, taken by a, end at its partition's owner, as
	// an owned beat there; byes too.
	owner := owners(16, []uint64{1, 2})
	var onA, onB []string
	for i := range 40 {
		u := fmt.Sprintf("u%d", i)
		if _, err := a.r.Heartbeat(ctx, u, "d", true); err != nil {
			t.Fatal(err)
		}
		p := a.r.partition(u)
		want := fmt.Sprintf("own %d %s d", p, u)
		if owner[p] == 1 {
			onA = append(onA, want)
		} else {
			onB = append(onB, want)
		}
	}
	if got := a.tr.take(); !slices.Equal(got, onA) {
		t.Errorf("a applied %v, want %v", got, onA)
	}
	if got := b.tr.take(); !slices.Equal(got, onB) {
		t.Errorf("b applied %v, want %v", got, onB)
	}
	if s := a.r.Stats(); s.Local != uint64(len(onA)) || s.Forwarded != uint64(len(onB)) || s.Fallback != 0 {
		t.Errorf("a's stats %+v", s)
	}
	var bu string // a user of b's
	for i := 0; bu == ""; i++ {
		if u := fmt.Sprintf("u%d", i); owner[a.r.partition(u)] == 2 {
			bu = u
		}
	}
	if _, err := a.r.Bye(ctx, bu, "d"); err != nil {
		t.Fatal(err)
	}
	if got := b.tr.take(); !slices.Equal(got, []string{"bye " + bu + " d"}) {
		t.Errorf("b applied %v for the bye", got)
	}
	// A connect reaches the owner as one: it claims the device again.
	if _, err := a.r.Connect(ctx, bu, "d", true); err != nil {
		t.Fatal(err)
	}
	if got, want := b.tr.take(), fmt.Sprintf("connect %d %s d", a.r.partition(bu), bu); !slices.Equal(got, []string{want}) {
		t.Errorf("b applied %v for the connect, want [%s]", got, want)
	}
	// The owner's refusal is the event's own; its other errors are
	// errors to retry.
	b.tr.fail = presence.ErrTooManyDevices
	if _, err := a.r.Heartbeat(ctx, bu, "d", true); !ingest.Refused(err) {
		t.Errorf("a refused beat came back as %v", err)
	}
	b.tr.fail = errors.New("store down")
	if _, err := a.r.Heartbeat(ctx, bu, "d", true); err == nil || ingest.Refused(err) {
		t.Errorf("a failed beat came back as %v", err)
	}
	b.tr.fail = nil
	b.tr.take()

	// b's lease changes (it was taken over and took a new one) while a
	// still sees the old one alive: a's forward is not answered, and a
	// applies the beat itself, unowned.
	b.lease.Store(3)
	testwait.For(t, "b to take events under its new lease", func() bool { t := b.r.table.Load(); return t != nil && t.self == 3 })
	if _, err := a.r.Heartbeat(ctx, bu, "d", true); err != nil {
		t.Fatal(err)
	}
	if got := a.tr.take(); !slices.Equal(got, []string{"beat " + bu + " d"}) {
		t.Errorf("a applied %v when b did not answer", got)
	}
	if s := a.r.Stats(); s.Fallback != 1 {
		t.Errorf("a's stats %+v", s)
	}
	// A disconnect is not applied where it was taken: the owner may
	// hold the device, and would not tell Redis of it again.
	if _, err := a.r.Bye(ctx, bu, "d"); !errors.Is(err, errNoOwner) || ingest.Refused(err) {
		t.Errorf("a bye its owner did not take: %v", err)
	}
	if got := a.tr.take(); len(got) != 0 {
		t.Errorf("a applied %v", got)
	}
	if got := b.tr.take(); len(got) != 0 {
		t.Errorf("b applied %v", got)
	}
}

// An owner whose workers are all taken answers busy at once: the sender
// applies a beat itself instead of waiting for its timeout, and fails a
// disconnect (delivered again).
func TestBusyOwnerAnswersAtOnce(t *testing.T) {
	srv := testsvc.NATS(t)
	live := func() []uint64 { return []uint64{1, 2} }
	a := newNode(t, srv.URL, 1, live)
	conn, err := jsstream.Dial(srv.URL, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	b := &node{tr: &fakeTracker{block: make(chan struct{})}}
	b.lease.Store(2)
	if b.r, err = New(Config{Conn: conn, Tracker: b.tr, Lease: b.lease.Load, Live: live, Partitions: 16,
		Timeout: 10 * time.Second, Every: 20 * time.Millisecond, Workers: 1}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = b.r.Run(ctx) }()
	defer func() { close(b.tr.block); cancel(); <-done }()
	testwait.For(t, "both routers to own their shares", func() bool {
		return a.r.Stats().Owned+b.r.Stats().Owned == 16 && b.r.Stats().Owned > 0
	})
	owner := owners(16, []uint64{1, 2})
	var bu []string // two users of b's
	for i := 0; len(bu) < 2; i++ {
		if u := fmt.Sprintf("u%d", i); owner[a.r.partition(u)] == 2 {
			bu = append(bu, u)
		}
	}
	// The first takes b's only worker, and waits there.
	first := make(chan error, 1)
	go func() { _, err := a.r.Heartbeat(context.Background(), bu[0], "d", true); first <- err }()
	testwait.For(t, "b applying the first beat", func() bool { return b.r.Stats().Received == 1 })
	start := time.Now()
	if _, err := a.r.Heartbeat(context.Background(), bu[1], "d", true); err != nil {
		t.Fatal(err)
	}
	if _, err := a.r.Bye(context.Background(), bu[1], "d"); !errors.Is(err, errNoOwner) {
		t.Errorf("a bye b was too busy for: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("a waited %v for a busy owner (its timeout is 10 s)", d)
	}
	if got := a.tr.take(); !slices.Equal(got, []string{"beat " + bu[1] + " d"}) {
		t.Errorf("a applied %v", got)
	}
	if s := b.r.Stats(); s.Busy != 2 {
		t.Errorf("b's stats %+v", s)
	}
}

func TestPartitionsThatLeaveAreHandedOff(t *testing.T) {
	srv := testsvc.NATS(t)
	var mu sync.Mutex
	live := []uint64{1}
	liveNow := func() []uint64 { mu.Lock(); defer mu.Unlock(); return slices.Clone(live) }
	a := newNode(t, srv.URL, 1, liveNow)
	testwait.For(t, "a owning every partition", func() bool { return a.r.Stats().Owned == 16 })
	mu.Lock()
	live = []uint64{1, 2}
	mu.Unlock()
	want := []uint32(nil)
	for p, o := range owners(16, []uint64{1, 2}) {
		if o == 2 {
			want = append(want, Source(p))
		}
	}
	testwait.For(t, "a handing off the partitions of the new node", func() bool {
		a.tr.mu.Lock()
		defer a.tr.mu.Unlock()
		return len(a.tr.handOffs) == len(want)
	})
	a.tr.mu.Lock()
	got := slices.Clone(a.tr.handOffs)
	a.tr.mu.Unlock()
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("handed off %v, want %v", got, want)
	}
	if s := a.r.Stats(); s.HandOffs != uint64(len(want)) || s.Owned != 16-len(want) {
		t.Errorf("a's stats %+v", s)
	}
}

// An owner that does not answer in time is not asked again for a while:
// its partitions' beats are applied where they are taken at once, its
// disconnects fail at once; after Suspect it is asked again.
func TestHungOwnerIsNotWaitedForAgain(t *testing.T) {
	srv := testsvc.NATS(t)
	live := func() []uint64 { return []uint64{1, 2} }
	start := func(lease uint64, tr *fakeTracker) *Router {
		conn, err := jsstream.Dial(srv.URL, "test", nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(conn.Close)
		r, err := New(Config{Conn: conn, Tracker: tr, Lease: func() uint64 { return lease }, Live: live, Partitions: 16,
			Timeout: 200 * time.Millisecond, Suspect: time.Second, Every: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return r
	}
	hung := &fakeTracker{block: make(chan struct{})}
	a, b := start(1, &fakeTracker{}), start(2, hung)
	defer close(hung.block) // (runs before the routers stop)
	testwait.For(t, "both routers to own their shares", func() bool {
		return a.Stats().Owned+b.Stats().Owned == 16 && b.Stats().Owned > 0
	})
	owner := owners(16, []uint64{1, 2})
	var bu string
	for i := 0; bu == ""; i++ {
		if u := fmt.Sprintf("u%d", i); owner[a.partition(u)] == 2 {
			bu = u
		}
	}
	ctx := context.Background()
	if _, err := a.Heartbeat(ctx, bu, "d", true); err != nil { // waits 200 ms, then applies it
		t.Fatal(err)
	}
	for range 5 {
		if _, err := a.Heartbeat(ctx, bu, "d", true); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Bye(ctx, bu, "d"); !errors.Is(err, errNoOwner) {
		t.Errorf("a bye to a hung owner: %v", err)
	}
	if s, sb := a.Stats(), b.Stats(); s.Skipped != 6 || s.Fallback != 6 || sb.Received != 1 {
		t.Errorf("a's stats %+v; b received %d, want the first beat only", s, sb.Received)
	}
	// After Suspect, b is asked again.
	time.Sleep(time.Second)
	if _, err := a.Heartbeat(ctx, bu, "d", true); err != nil {
		t.Fatal(err)
	}
	if sb := b.Stats(); sb.Received != 2 {
		t.Errorf("b received %d events after its suspect time, want 2", sb.Received)
	}
}

// The partition of a user is 32-bit FNV-1a of its id, as every node
// computes it, without an allocation.
func TestPartitionIsFNV1a(t *testing.T) {
	r := &Router{cfg: Config{Partitions: 256}}
	for _, u := range []string{"", "42", "alice", "ünïcode"} {
		h := fnv.New32a()
		_, _ = h.Write([]byte(u))
		if got, want := r.partition(u), int(h.Sum32()%256); got != want {
			t.Errorf("partition(%q) = %d, want %d", u, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { r.partition("alice") }); n != 0 {
		t.Errorf("partition allocates %v times", n)
	}
}
