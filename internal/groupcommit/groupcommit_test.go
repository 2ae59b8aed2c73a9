package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/testwait"
)

// log is a commit function that records every group it is given; it
// blocks until release is closed, and fails a group holding a write in bad.
type log struct {
	mu     sync.Mutex // guards the fields below
	groups [][]string
	ctxs   []context.Context
	bad    map[string]bool

	release chan struct{} // commits wait until it is closed
	entered chan struct{} // a commit began
}

func newLog() *log {
	return &log{bad: map[string]bool{}, release: make(chan struct{}), entered: make(chan struct{}, 100)}
}

func (l *log) commit(ctx context.Context, ws []string) error {
	l.entered <- struct{}{}
	<-l.release
	l.mu.Lock()
	defer l.mu.Unlock()
	l.groups = append(l.groups, slices.Clone(ws))
	l.ctxs = append(l.ctxs, ctx)
	for _, w := range ws {
		if l.bad[w] {
			return fmt.Errorf("bad write %s", w)
		}
	}
	return nil
}

func (l *log) taken() [][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.groups)
}

// waitQueued waits until n writes wait in c's queue.
func waitQueued[W any](t *testing.T, c *Committer[W], n int) {
	t.Helper()
	var have int
	testwait.Forf(t, func() string { return fmt.Sprintf("%d queued writes (have %d)", n, have) }, func() bool {
		c.mu.Lock()
		have = len(c.queue)
		c.mu.Unlock()
		return have >= n
	})
}

// TestGroups: writes queued while a commit runs go together in the next
// one, and each caller gets its own outcome when that group fails.
func TestGroups(t *testing.T) {
	l := newLog()
	c := New(Config{}, l.commit)
	defer c.Close()
	ctx := context.Background()

	first := make(chan error, 1)
	go func() { first <- c.Write(ctx, "first") }()
	<-l.entered // the first commit runs, alone

	const n = 10
	l.bad["w3"], l.bad["w7"] = true, true
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = c.Write(ctx, fmt.Sprintf("w%d", i)) })
	}
	waitQueued(t, c, n)
	close(l.release)
	if err := <-first; err != nil {
		t.Fatalf("first write: %v", err)
	}
	wg.Wait()

	groups := l.taken()
	if len(groups) < 2 || len(groups[0]) != 1 || len(groups[1]) != n {
		t.Fatalf("groups %q, want [first], then all %d queued writes together, then each alone", groups, n)
	}
	// The failed group is retried one write at a time, in its order.
	if got, want := groups[2:], func() [][]string {
		var w [][]string
		for _, x := range groups[1] {
			w = append(w, []string{x})
		}
		return w
	}(); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("after the failed group: commits %q, want %q", got, want)
	}
	for i, err := range errs {
		if bad := i == 3 || i == 7; bad != (err != nil) {
			t.Errorf("write w%d: got %v, want an error only for w3 and w7", i, err)
		}
	}
}

// TestCancelWhileQueued: a write whose caller gives up while it waits is
// dropped, and its caller gets ctx's error at once.
func TestCancelWhileQueued(t *testing.T) {
	l := newLog()
	c := New(Config{}, l.commit)
	defer c.Close()
	go func() { _ = c.Write(context.Background(), "first") }()
	<-l.entered

	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() { got <- c.Write(ctx, "gave up") }()
	waitQueued(t, c, 1)
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Errorf("Write after its context was cancelled: got %v, want %v", err, context.Canceled)
	}
	kept := make(chan error, 1)
	go func() { kept <- c.Write(context.Background(), "kept") }()
	waitQueued(t, c, 1) // the write that gave up left the queue
	close(l.release)
	if err := <-kept; err != nil {
		t.Fatal(err)
	}
	if got, want := l.taken(), [][]string{{"first"}, {"kept"}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("commits %q, want %q", got, want)
	}
	if err := c.Write(ctx, "late"); !errors.Is(err, context.Canceled) {
		t.Errorf("Write with a cancelled context: got %v, want %v", err, context.Canceled)
	}
}

// TestDeadline: a commit has the latest deadline of its group's callers,
// none if one has none, and is never cancelled by a caller.
func TestDeadline(t *testing.T) {
	l := newLog()
	c := New(Config{}, l.commit)
	defer c.Close()
	go func() { _ = c.Write(context.Background(), "first") }()
	<-l.entered

	soon := time.Now().Add(time.Hour)
	later := soon.Add(time.Hour)
	ctx1, cancel1 := context.WithDeadline(context.Background(), soon)
	defer cancel1()
	ctx2, cancel2 := context.WithDeadline(context.Background(), later)
	defer cancel2()
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Write(ctx1, "a") })
	wg.Go(func() { _ = c.Write(ctx2, "b") })
	waitQueued(t, c, 2)
	close(l.release)
	wg.Wait()
	l.mu.Lock()
	ctxs := slices.Clone(l.ctxs)
	l.mu.Unlock()
	if _, ok := ctxs[0].Deadline(); ok {
		t.Errorf("commit of a write without deadline has one")
	}
	if d, ok := ctxs[1].Deadline(); !ok || !d.Equal(later) {
		t.Errorf("commit deadline %v (set %v), want the latest, %v", d, ok, later)
	}
}

// TestClose: Close commits what is queued, is idempotent, and later
// writes fail with ErrClosed.
func TestClose(t *testing.T) {
	l := newLog()
	c := New(Config{QueueLen: 4}, l.commit)
	ctx := context.Background()
	errs := make(chan error, 10)
	go func() { errs <- c.Write(ctx, "first") }()
	<-l.entered
	for i := range 3 {
		go func() { errs <- c.Write(ctx, fmt.Sprint(i)) }()
	}
	waitQueued(t, c, 3)
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	close(l.release)
	<-closed
	c.Close()
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("a write queued before Close: %v", err)
		}
	}
	if n := len(l.taken()); n != 2 {
		t.Errorf("%d commits, want 2 (the first, then the queued ones)", n)
	}
	if err := c.Write(ctx, "late"); !errors.Is(err, ErrClosed) {
		t.Errorf("Write after Close: got %v, want %v", err, ErrClosed)
	}
}

// TestRandomCancels: writers whose contexts end at any moment; every
// call returns, every write is committed at most once, every nil is a
// committed write, and Close returns (no commit is left without a leader).
func TestRandomCancels(t *testing.T) {
	var mu sync.Mutex
	committed := map[string]int{}
	c := New(Config{QueueLen: 16, MaxGroup: 8}, func(_ context.Context, ws []string) error {
		time.Sleep(50 * time.Microsecond) // a commit takes a while: groups form
		mu.Lock()
		defer mu.Unlock()
		for _, w := range ws {
			committed[w]++
		}
		return nil
	})
	const n = 400
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if i%3 != 0 {
				go func() {
					for range i % 7 {
						runtime.Gosched()
					}
					cancel()
				}()
			}
			errs[i] = c.Write(ctx, fmt.Sprint(i))
		})
	}
	wg.Wait()
	c.Close()
	mu.Lock()
	defer mu.Unlock()
	for i, err := range errs {
		w := fmt.Sprint(i)
		switch {
		case committed[w] > 1:
			t.Errorf("write %s committed %d times", w, committed[w])
		case err == nil && committed[w] != 1:
			t.Errorf("write %s returned nil but was not committed", w)
		case err != nil && !errors.Is(err, context.Canceled):
			t.Errorf("write %s: %v", w, err)
		case i%3 == 0 && err != nil:
			t.Errorf("write %s, never cancelled: %v", w, err)
		}
	}
}

// TestPanic: a commit that panics fails its group with an error, panics
// in the caller that ran it, and the next commits go on.
func TestPanic(t *testing.T) {
	l := newLog()
	c := New(Config{}, func(ctx context.Context, ws []string) error {
		if slices.Contains(ws, "boom") {
			panic("boom")
		}
		return l.commit(ctx, ws)
	})
	close(l.release)
	defer c.Close()
	var panicked any
	func() {
		defer func() { panicked = recover() }()
		_ = c.Write(context.Background(), "boom")
	}()
	if panicked != "boom" {
		t.Errorf("the caller that ran the commit: recovered %v, want the commit's panic", panicked)
	}
	if err := c.Write(context.Background(), "after"); err != nil {
		t.Errorf("a write after the panic: %v", err)
	}
}
