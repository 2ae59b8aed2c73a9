package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
)

// TestConcurrentUse runs writers (beats with device ids of many lengths,
// byes, loads after eviction), a sweeper, a checkpointer and batch readers
// at once, under -race: ids handed out by Dirty and Expire are read by
// other goroutines while the shards append to and compact their arenas, and
// every read must name the user asked for.
func TestConcurrentUse(t *testing.T) {
	r := presence.Rules{TTL: 50 * time.Millisecond, CloseGrace: 10 * time.Millisecond}.WithDefaults()
	s := memstore.New(memstore.Config{Rules: r, Shards: 4, EvictAfter: time.Millisecond})
	ctx := context.Background()
	var ids []string
	for i := range 64 {
		ids = append(ids, fmt.Sprint(strings.Repeat("u", i%50), i))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var handed [][2]string
	now := func() int64 { return time.Now().UnixMilli() }
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := ids[(i*7+w)%len(ids)]
				dev := strings.Repeat("d", i%40) + fmt.Sprint(w)
				if _, err := s.Beat(ctx, now(), id, dev, true); errors.Is(err, tracker.ErrNotLoaded) {
					if err := s.Load(ctx, now(), &presence.Profile{UserID: id}); err != nil {
						t.Error(err)
						return
					}
				}
				if i%3 == 0 {
					s.Bye(ctx, now(), id, dev)
				}
			}
		}()
	}
	wg.Add(3)
	go func() {
		defer wg.Done()
		var out []presence.Change
		for {
			select {
			case <-stop:
				return
			default:
			}
			out, _ = s.Expire(ctx, now(), 100, out[:0])
			mu.Lock()
			for _, ch := range out {
				handed = append(handed, [2]string{ch.Event.UserID, strings.Clone(ch.Event.UserID)})
			}
			mu.Unlock()
		}
	}()
	go func() {
		defer wg.Done()
		var out []presence.Profile
		for {
			select {
			case <-stop:
				return
			default:
			}
			out, _ = s.Dirty(ctx, out[:0])
			mu.Lock()
			for _, p := range out {
				handed = append(handed, [2]string{p.UserID, strings.Clone(p.UserID)})
			}
			for _, h := range handed {
				if h[0] != h[1] {
					t.Errorf("an id handed out as %q now reads %q", h[1], h[0])
				}
			}
			if len(handed) > 5000 {
				handed = handed[:0]
			}
			mu.Unlock()
		}
	}()
	go func() {
		defer wg.Done()
		snaps := make([]presence.Snapshot, len(ids))
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := s.Get(ctx, now(), ids, snaps); err != nil {
				t.Error(err)
				return
			}
			for i, sn := range snaps {
				if sn.UserID != ids[i] {
					t.Errorf("Get(%q) named %q", ids[i], sn.UserID)
				}
			}
		}
	}()
	time.Sleep(2 * time.Second) // the scenario: 2 s of concurrent use, hundreds of compactions
	close(stop)
	wg.Wait()
	if s.Compactions() == 0 {
		t.Errorf("no arena was compacted")
	}
	t.Logf("%d compactions, %d users held", s.Compactions(), s.Len())
}
