package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/testsvc"
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

// The caller that happens to send a call may have its context cancelled;
// the other callers' beats in that call must not fail for it. Its
// deadline (the tracker's store timeout) is kept.
func TestCallContext(t *testing.T) {
	parent, cancel := context.WithTimeout(context.Background(), time.Hour)
	ctx, release := redisstore.CallContext(parent)
	defer release()
	cancel()
	if err := ctx.Err(); err != nil {
		t.Fatalf("call context ended with its caller's: %v", err)
	}
	dl, ok := ctx.Deadline()
	if want, _ := parent.Deadline(); !ok || !dl.Equal(want) {
		t.Fatalf("deadline %v %v, want the caller's %v", dl, ok, want)
	}
	short, cancel2 := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel2()
	ctx2, release2 := redisstore.CallContext(short)
	defer release2()
	<-ctx2.Done()
	if !errors.Is(ctx2.Err(), context.DeadlineExceeded) {
		t.Fatalf("after the deadline: %v", ctx2.Err())
	}
}
