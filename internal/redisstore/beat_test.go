package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tracker"
)

// Many callers beating at once: every beat is applied and answered, and
// they share script calls (the point of batching). Each user's last beat
// time must be the one kept.
func TestConcurrentBeatsShareCalls(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		t.Run(fmt.Sprint("cluster=", cluster), func(t *testing.T) {
			c := client(t)
			if cluster {
				c = dial(t, testsvc.RedisCluster(t, 3).URL)
			}
			s := newStore(t, c, redisstore.Config{Shards: 4})
			ctx := context.Background()
			const callers, beats, t0 = 200, 30, int64(1_700_000_000_000)
			for i := range callers {
				if err := s.Load(ctx, t0, &presence.Profile{UserID: fmt.Sprint("u", i)}); err != nil {
					t.Fatal(err)
				}
			}
			before := s.BeatCalls()
			var wg sync.WaitGroup
			for i := range callers {
				wg.Go(func() {
					user := fmt.Sprint("u", i)
					for k := range int64(beats) {
						ch, err := s.Beat(ctx, t0+k, user, "d", true)
						if err != nil {
							t.Errorf("%s beat %d: %v", user, k, err)
							return
						}
						if k == 0 && (!ch.Changed || ch.Event.Status != presence.Online) {
							t.Errorf("%s's first beat: %+v, want online", user, ch)
						}
						if k > 0 && ch.Changed {
							t.Errorf("%s beat %d changed %+v", user, k, ch)
						}
					}
				})
			}
			wg.Wait()
			calls := s.BeatCalls() - before
			t.Logf("%d beats in %d script calls", callers*beats, calls)
			if calls >= callers*beats {
				t.Errorf("%d beats took %d script calls: no batching", callers*beats, calls)
			}
			for i := range callers {
				u, _, ok, err := s.Debug(ctx, fmt.Sprint("u", i))
				if err != nil || !ok {
					t.Fatalf("Debug: %v %v", ok, err)
				}
				if u.LastSeen != t0+beats-1 || len(u.Devices) != 1 || u.Devices[0].LastBeat != t0+beats-1 {
					t.Fatalf("u%d after %d beats: %+v", i, beats, u)
				}
			}
		})
	}
}

// A call carries other callers' beats: it is never cancelled, and it has
// until the latest deadline of its callers, or none if one has none.
func TestCallContext(t *testing.T) {
	now := time.Now()
	ctx, release := redisstore.CallContext(now.Add(time.Second), now.Add(time.Hour), now.Add(time.Minute))
	defer release()
	if dl, ok := ctx.Deadline(); !ok || !dl.Equal(now.Add(time.Hour)) {
		t.Fatalf("deadline %v %v, want the latest, %v", dl, ok, now.Add(time.Hour))
	}
	ctx2, release2 := redisstore.CallContext(now.Add(time.Second), time.Time{})
	defer release2()
	if dl, ok := ctx2.Deadline(); ok {
		t.Fatalf("deadline %v with a caller that has none", dl)
	}
	ctx3, release3 := redisstore.CallContext(now.Add(time.Millisecond))
	defer release3()
	<-ctx3.Done()
	if !errors.Is(ctx3.Err(), context.DeadlineExceeded) {
		t.Fatalf("after the deadline: %v", ctx3.Err())
	}
}

// Redis hangs while a call is in flight; the caller whose beat will send
// the next call has a short deadline, the callers queued behind it long
// ones. Their beats must get the time their own callers allow, not the
// sender's: when Redis answers again within it, they succeed. (With the
// sender's deadline they all failed, and the tracker took that for an
// outage.) One shard, so all the beats share one group.
func TestBatchHasItsCallersTime(t *testing.T) {
	srv := testsvc.Redis(t)
	s := newStore(t, dial(t, srv.URL), redisstore.Config{Shards: 1})
	ctx := context.Background()
	const t0, n = int64(1_700_000_000_000), 20
	for i := range n + 1 {
		if err := s.Load(ctx, t0, &presence.Profile{UserID: fmt.Sprint("u", i)}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Beat(ctx, t0, fmt.Sprint("u", i), "d", true); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	var wg sync.WaitGroup
	beat := func(i int, d time.Duration) time.Time {
		deadline := time.Now().Add(d)
		wg.Go(func() {
			bctx, cancel := context.WithDeadline(ctx, deadline)
			defer cancel()
			_, err := s.Beat(bctx, t0+1, fmt.Sprint("u", i), "d", true)
			if i != 1 && err != nil {
				t.Errorf("u%d (10 s to spare) failed: %v", i, err)
			}
		})
		return deadline
	}
	queue := func(want int) func() bool {
		return func() bool { q, f := s.BeatQueue(); return q == want && f == 1 }
	}
	beat(0, 10*time.Second) // in flight, waiting on the paused Redis
	testwait.For(t, "u0's call in flight", queue(0))
	u1 := beat(1, 400*time.Millisecond) // first in the queue: sends the next call
	testwait.For(t, "u1 queued", queue(1))
	for i := 2; i <= n; i++ {
		beat(i, 10*time.Second)
	}
	testwait.For(t, "every beat queued", queue(n))
	time.Sleep(time.Until(u1)) // the scenario: Redis hangs past u1's deadline
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	wg.Wait()
	if _, err := s.Beat(ctx, t0+2, "u2", "d", true); err != nil {
		t.Fatalf("a beat after the pause: %v", err)
	}
}

// Behind a proxy for a sharded Redis the client sees one server, but a
// call whose keys span slots is refused with CROSSSLOT. The first refusal
// switches the store to calls within one shard, and beats go through
// again. A one-node Cluster reached by a plain client plays the proxy.
func TestCrossSlotRefusalFallsBackToShards(t *testing.T) {
	cl := testsvc.RedisCluster(t, 1)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{cl.Nodes[0].Addr}, ForceSingleClient: true,
		DisableCache: true, AlwaysRESP2: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	s := newStore(t, c, redisstore.Config{Shards: 8})
	ctx := context.Background()
	const t0 = int64(1_700_000_000_000)
	var users []string
	for i := range 40 {
		u := fmt.Sprint("u", i)
		users = append(users, u)
		if err := s.Load(ctx, t0, &presence.Profile{UserID: u}); err != nil {
			t.Fatal(err)
		}
	}
	// Forty users over eight shards: one call with all of them spans slots.
	beats := make([]redisstore.BeatArgs, len(users))
	for i, u := range users {
		beats[i] = redisstore.BeatArgs{User: u, Device: "d", Now: t0, Active: true}
	}
	_, errs := s.BeatBatch(ctx, beats)
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "CROSSSLOT") {
		t.Fatalf("a call across slots: %v, want CROSSSLOT", errs[0])
	}
	var wg sync.WaitGroup
	for _, u := range users {
		wg.Go(func() {
			ch, err := s.Beat(ctx, t0+1, u, "d", true)
			if err != nil {
				t.Errorf("%s: %v", u, err)
			} else if !ch.Changed || ch.Event.Status != presence.Online {
				t.Errorf("%s: %+v, want online", u, ch)
			}
		})
	}
	wg.Wait()
}

// A panic in a call (a bug) must not wedge its group: the callers of the
// batch get an error, the group is released, and the panic goes on up.
func TestPanicInCallReleasesTheGroup(t *testing.T) {
	s := newStore(t, client(t), redisstore.Config{Shards: 1})
	panicked, otherErr, released := s.PanicInCall()
	if !panicked {
		t.Error("the panic did not reach the sender")
	}
	if otherErr == nil || !strings.Contains(otherErr.Error(), "panic") {
		t.Errorf("the other caller got %v, want an error naming the panic", otherErr)
	}
	if !released {
		t.Error("the group is still held")
	}
}

// BeatRead answers, in the beat's own call, what Get reads right after:
// on the fast path and the full one (a new device, a status the beat
// changes, a user whose away is due), alone and in batches of concurrent
// callers, with and without a manual status and owned devices.
func TestBeatReadIsGet(t *testing.T) {
	s := newStore(t, client(t), redisstore.Config{Shards: 4})
	ctx := context.Background()
	const t0 = int64(1_700_000_000_000)
	users := 60
	for i := range users {
		if err := s.Load(ctx, t0, &presence.Profile{UserID: fmt.Sprint("r", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.SetStatus(ctx, t0, "r1", presence.ManualBusy, "in a meeting"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetStatus(ctx, t0, "r2", presence.ManualInvisible, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, t0, 9, "r3", tracker.OwnedDevice{ID: "ws", LastBeat: t0, LastActive: presence.Forever}); err != nil {
		t.Fatal(err)
	}
	var filled, total atomic.Int64
	// Three rounds: first beats (full path: new devices), beats that
	// change nothing (fast path), beats a while later from a second
	// device, background beats (active false) after the idle time.
	rounds := []struct {
		at     int64
		dev    string
		active bool
	}{{t0 + 1, "d", true}, {t0 + 2, "d", true}, {t0 + 1000, "e", true}, {t0 + 400_000, "d", false}}
	for _, rd := range rounds {
		// The sweeper's work up to now (it re-arms the due entries that
		// a beat only moved later).
		if _, err := s.Expire(ctx, rd.at, 100_000, nil); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := range users {
			wg.Go(func() {
				u := fmt.Sprint("r", i)
				var got presence.Snapshot
				_, ok, err := s.BeatRead(ctx, rd.at, u, rd.dev, rd.active, &got)
				if err != nil {
					t.Errorf("BeatRead %s at %d: %v", u, rd.at, err)
					return
				}
				total.Add(1)
				if !ok {
					return
				}
				filled.Add(1)
				var want [1]presence.Snapshot
				if err := s.Get(ctx, rd.at, []string{u}, want[:]); err != nil {
					t.Errorf("Get %s: %v", u, err)
					return
				}
				if got != want[0] {
					t.Errorf("%s at %d: BeatRead read %+v, Get %+v", u, rd.at, got, want[0])
				}
			})
		}
		wg.Wait()
	}
	if filled.Load() < total.Load()*9/10 {
		t.Errorf("BeatRead filled the snapshot for %d of %d beats; want nearly all", filled.Load(), total.Load())
	}
}
