package tracker_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tracker"
)

// claimCounter is a Redis store that counts the claims in flight.
type claimCounter struct {
	*redisstore.Store
	inFlight, peak, calls atomic.Int64
}

func (s *claimCounter) Claim(ctx context.Context, now int64, lease uint64, user string, d tracker.OwnedDevice) (presence.Change, error) {
	n := s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	s.calls.Add(1)
	for {
		p := s.peak.Load()
		if n <= p || s.peak.CompareAndSwap(p, n) {
			break
		}
	}
	return s.Store.Claim(ctx, now, lease, user, d)
}

// A reconnect storm's connects wait for their turn before they claim:
// at most Config.MaxClaims claims are in flight, however many sockets
// connect at once (Redis is paused while they come, so that they pile
// up), and every device is claimed once Redis answers again.
func TestClaimsInFlightAreBounded(t *testing.T) {
	redis := testsvc.Redis(t)
	c := newCluster(t, redis)
	c.tweak = func(cfg *tracker.Config) { cfg.StoreTimeout = time.Minute } // the pause is no outage
	var cs *claimCounter
	a := c.addWith(1, func(rs *redisstore.Store) tracker.Store {
		cs = &claimCounter{Store: rs}
		return cs
	})
	a.alive = true
	if err := redis.Pause(); err != nil {
		t.Fatal(err)
	}
	const n = 200
	users := make([]string, n)
	var wg sync.WaitGroup
	for i := range users {
		users[i] = fmt.Sprint("u", i)
		wg.Go(func() {
			if _, err := a.tr.SocketConnect(a.ctx, users[i], "d"); err != nil {
				t.Errorf("SocketConnect(%s): %v", users[i], err)
			}
		})
	}
	testwait.Forf(t, func() string {
		return fmt.Sprintf("%d claims in flight, want %d (the most at once)", cs.inFlight.Load(), tracker.DefaultMaxClaims)
	}, func() bool { return cs.inFlight.Load() == tracker.DefaultMaxClaims })
	if err := redis.Resume(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if p := cs.peak.Load(); p > tracker.DefaultMaxClaims {
		t.Errorf("%d connects at once: %d claims in flight at the peak, want at most %d", n, p, tracker.DefaultMaxClaims)
	}
	if got := cs.calls.Load(); got < n {
		t.Errorf("%d claims made, want at least one a device (%d)", got, n)
	}
	for i, s := range a.read(users...) {
		if s.Status != presence.Online {
			t.Errorf("%s after its connect: %v, want online", users[i], s.Status)
		}
	}
	if st := a.tr.Stats(); st.Outages != 0 {
		t.Errorf("outages of the store: %d, want 0", st.Outages)
	}
}
