package redisstore_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
)

// noteLog collects what Store.Notes hears.
type noteLog struct {
	mu    sync.Mutex
	notes []string
	up    bool
	ups   int
}

func (l *noteLog) note(user string) { l.mu.Lock(); l.notes = append(l.notes, user); l.mu.Unlock() }
func (l *noteLog) setUp(up bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.up = up
	if up {
		l.ups++
	}
}
func (l *noteLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.notes
	l.notes = nil
	return n
}
func (l *noteLog) isUp() bool { l.mu.Lock(); defer l.mu.Unlock(); return l.up }

// hear runs s.Notes for the test and waits until it is subscribed.
func hear(t testing.TB, s *redisstore.Store) (*noteLog, context.Context) {
	t.Helper()
	l := &noteLog{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Notes(ctx, 10*time.Millisecond, l.note, l.setUp) }()
	t.Cleanup(func() { cancel(); <-done })
	testwait.For(t, "the notes to be heard", l.isUp)
	return l, ctx
}

// twoDevices loads user and beats two devices of it: the second is noted.
func twoDevices(t *testing.T, ctx context.Context, s *redisstore.Store, now int64, user string) {
	t.Helper()
	if err := s.Load(ctx, now, &presence.Profile{UserID: user}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"d1", "d2"} {
		if _, err := s.Beat(ctx, now, user, d, true); err != nil {
			t.Fatal(err)
		}
	}
}

// A device that comes or goes while the user shows present and nothing
// else changes is noted on the shard's channel; a change everyone sees
// (it has a version and goes out as a change) and anything of a user
// who shows offline is not.
func TestDeviceNotes(t *testing.T) {
	c := client(t)
	s := newStore(t, c, redisstore.Config{})
	l, ctx := hear(t, s)

	const t0 = int64(1_700_000_000_000)
	steps := 0
	step := func(what string, want []string, op func(now int64) error) {
		t.Helper()
		if err := op(t0); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		// A marker after the step (a user of its own with a second
		// device): what the step noted comes before its note.
		steps++
		marker := "marker" + strconv.Itoa(steps)
		twoDevices(t, ctx, s, t0, marker)
		var got []string
		testwait.For(t, "the marker's note", func() bool {
			got = append(got, l.take()...)
			return len(got) > 0 && got[len(got)-1] == marker
		})
		got = got[:len(got)-1]
		if !slices.Equal(got, want) {
			t.Errorf("%s: noted %q, want %q", what, got, want)
		}
	}
	beat := func(user, dev string) func(int64) error {
		return func(now int64) error { _, err := s.Beat(ctx, now, user, dev, true); return err }
	}
	load := func(now int64) error {
		for _, u := range []string{"a", "inv"} {
			if err := s.Load(ctx, now, &presence.Profile{UserID: u}); err != nil {
				return err
			}
		}
		return nil
	}
	step("load", nil, load)
	step("first device", nil, beat("a", "d1")) // offline → online: a change
	step("second device", []string{"a"}, beat("a", "d2"))
	step("a beat", nil, beat("a", "d2"))
	step("a bye", []string{"a"}, func(now int64) error { _, err := s.Bye(ctx, now, "a", "d2"); return err })
	step("a status", nil, func(now int64) error {
		_, err := s.SetStatus(ctx, now, "a", presence.ManualBusy, "")
		return err
	})
	step("invisible", nil, func(now int64) error {
		if _, err := s.Beat(ctx, now, "inv", "d1", true); err != nil {
			return err
		}
		_, err := s.SetStatus(ctx, now, "inv", presence.ManualInvisible, "")
		return err
	})
	step("invisible's second device", nil, beat("inv", "d2"))

	// The probes of a live connection do not break it (a PING a second
	// on a subscribed connection).
	time.Sleep(2500 * time.Millisecond)
	l.mu.Lock()
	ups, up := l.ups, l.up
	l.mu.Unlock()
	if ups != 1 || !up {
		t.Fatalf("after the probes: subscribed %d times, up %v; want once, up", ups, up)
	}
	step("after the probes", []string{"a"}, beat("a", "d2"))

	// A lost connection: up(false), then subscribed again.
	if err := c.Do(ctx, c.B().Arbitrary("CLIENT", "KILL", "TYPE", "pubsub").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the notes to be heard again", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.ups == 2 && l.up
	})
	step("after the loss", []string{"a"}, beat("a", "d3"))
}

// On a Redis Cluster the shards' channels live on every master: each is
// heard on a connection of its own, and a second device of users all
// over the cluster is noted.
func TestDeviceNotesOnACluster(t *testing.T) {
	cl := testsvc.RedisCluster(t, 3)
	s := newStore(t, dial(t, cl.URL), redisstore.Config{})
	l, ctx := hear(t, s)

	const t0 = int64(1_700_000_000_000)
	var want []string
	for i := range 30 {
		u := "c" + strconv.Itoa(i)
		want = append(want, u)
		twoDevices(t, ctx, s, t0, u)
	}
	var got []string
	testwait.For(t, "a note of each user", func() bool {
		got = append(got, l.take()...)
		return len(got) >= len(want)
	})
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("noted %q, want %q", got, want)
	}
}
