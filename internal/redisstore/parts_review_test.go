package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/tracker"
)

// One master of the Cluster is killed (its replica not promoted yet) while
// a dead node's lease is taken over and users are due on every master:
// the calls on every shard name only the killed master's shards as failed
// (PartialError.Parts) — not the healthy shards whose turn came after the
// dead master's used up the call's time, which the tracker would mark
// down — and, leaving those shards alone, take over and sweep the others
// at once (a dead node's devices do not stay online until the master is
// back).
func TestCallsOnEveryShardWithAMasterDown(t *testing.T) {
	t.Parallel()
	cl := testsvc.RedisClusterReplicas(t, 3, 1)
	c := dial(t, cl.URL)
	prefix := testsvc.Unique(t) + ":"
	s := newStore(t, c, redisstore.Config{Rules: leaseRules, Prefix: prefix, EvictAfter: time.Hour})
	const lease, renewed = 7, 5000
	master := map[string]*testsvc.Server{}
	masters := make([]*testsvc.Server, s.Parts())
	for p := range masters {
		m, err := cl.MasterOf(fmt.Sprintf("%s{%d}x", prefix, p))
		if err != nil {
			t.Fatal(err)
		}
		masters[p] = m
	}
	shardMaster := func(p int) *testsvc.Server { return masters[p] }
	var users, beaters []string
	for i := range 30 {
		u := fmt.Sprint("u", i)
		users = append(users, u)
		load(t, s, 1000, u)
		mustClaim(t, s, 1000, lease, u, "phone", 1000, 1000)
		master[u] = shardMaster(s.Part(u))
		b := fmt.Sprint("b", i)
		beaters = append(beaters, b)
		load(t, s, 1000, b)
		if _, err := s.Beat(context.Background(), 1000, b, "pc", true); err != nil {
			t.Fatal(err)
		}
		master[b] = shardMaster(s.Part(b))
	}
	victim := master[users[0]]
	if err := cl.WaitReplicated(victim, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	wantVictims := func(what string, err error) []int {
		t.Helper()
		var pe *tracker.PartialError
		if !errors.As(err, &pe) || len(pe.Parts) == 0 {
			t.Fatalf("%s with a master down: %v, want a PartialError naming its shards", what, err)
		}
		for _, p := range pe.Parts {
			if shardMaster(p) != victim {
				t.Errorf("%s: shard %d named as failed, its master answers", what, p)
			}
		}
		return pe.Parts
	}
	now := int64(renewed + lTTL) // the takeover and every beater's expiry are due
	call := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), time.Second)
	}

	ctx, cancel := call()
	_, err := s.TakeOver(ctx, now, lease, renewed, nil, nil)
	cancel()
	down := wantVictims("takeover", err)
	ctx, cancel = call()
	_, err = s.ExpireParts(ctx, now, 1000, nil, nil)
	cancel()
	down = append(down, wantVictims("sweep", err)...)
	skip := func(p int) bool { return slices.Contains(down, p) }

	ctx, cancel = call()
	out, err := s.TakeOverParts(ctx, now, lease, renewed, nil, skip, nil)
	cancel()
	if err != nil {
		t.Fatalf("takeover of the shards that answer: %v", err)
	}
	ctx, cancel = call()
	swept, err := s.ExpireParts(ctx, now, 1000, skip, nil)
	cancel()
	if err != nil {
		t.Fatalf("sweep of the shards that answer: %v", err)
	}
	got := map[string]bool{}
	for _, ch := range append(out, swept...) {
		got[ch.Event.UserID] = true
		if ch.Event.Status != presence.Offline {
			t.Errorf("%s: %+v, want offline", ch.Event.UserID, ch.Event)
		}
	}
	for _, u := range append(users, beaters...) {
		if on := master[u] == victim; on == got[u] && (!on || !skip(s.Part(u))) {
			t.Errorf("%s (on the killed master: %v) offline: %v", u, on, got[u])
		}
	}
}
