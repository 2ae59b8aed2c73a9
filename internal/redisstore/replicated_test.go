package redisstore_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tracker"
)

// A claim is acknowledged only once every replica of its master holds it
// (WAIT): with a master's replica frozen (as when the master is cut off
// from it) claims of that master's users fail with ErrNotReplicated and
// the others' succeed; with the replica back they succeed again; with
// the replica gone (killed: the master no longer counts it) they succeed
// without waiting.
func TestClaimsWaitForTheReplicas(t *testing.T) {
	t.Parallel()
	cl := testsvc.RedisClusterReplicas(t, 3, 1)
	c := dial(t, cl.URL)
	ctx := t.Context()
	prefix := testsvc.Unique(t) + ":"
	s := newStore(t, c, redisstore.Config{Rules: leaseRules, Prefix: prefix, EvictAfter: time.Hour})
	masterOf := func(user string) *testsvc.Server {
		t.Helper()
		m, err := cl.MasterOf(bucketKey(prefix, 256, 64, user))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	claim := func(user string) error {
		_, err := s.Claim(ctx, 1000, 5, user, tracker.OwnedDevice{ID: "d", LastBeat: 1000, LastActive: presence.Forever})
		return err
	}
	// claimRetried retries a claim that a healthy replica did not confirm
	// within WAIT's 100 ms, as the owned table does: on a loaded machine a
	// replica may lag that long without anything being wrong.
	claimRetried := func(user string) error {
		deadline := time.Now().Add(testwait.Timeout)
		for {
			err := claim(user)
			if !errors.Is(err, tracker.ErrNotReplicated) || time.Now().After(deadline) {
				return err
			}
		}
	}
	// Users on every master, claimed while all is well (the store learns
	// each master's replicas).
	var users []string
	for i := range 60 {
		u := fmt.Sprint("r", i)
		users = append(users, u)
		load(t, s, 1000, u)
		if err := claimRetried(u); err != nil {
			t.Fatalf("claim of %s with every replica up: %v", u, err)
		}
	}
	m := masterOf(users[0])
	reps, err := cl.ReplicasOf(m)
	if err != nil || len(reps) != 1 {
		t.Fatalf("replicas of %s: %v %v", m.Addr, reps, err)
	}
	var on, off []string
	for _, u := range users[1:] {
		if masterOf(u) == m {
			on = append(on, u)
		} else {
			off = append(off, u)
		}
	}
	if len(on) == 0 || len(off) == 0 {
		t.Fatalf("users on the master: %d, elsewhere: %d", len(on), len(off))
	}

	// Many claims at once (a reconnect storm) share a bounded pool of
	// connections of their own: the master does not see one per claim.
	mc := dial(t, "redis://"+m.Addr)
	clients := func() int {
		t.Helper()
		info, err := mc.Do(ctx, mc.B().Info().Section("clients").Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			if n, ok := strings.CutPrefix(line, "connected_clients:"); ok {
				c, _ := strconv.Atoi(n)
				return c
			}
		}
		t.Fatalf("no connected_clients in %q", info)
		return 0
	}
	before := clients()
	var wg sync.WaitGroup
	for i := range 300 {
		wg.Go(func() {
			u := fmt.Sprint("storm", i)
			if err := s.Load(ctx, 1000, &presence.Profile{UserID: u}); err != nil {
				t.Error(err)
				return
			}
			if err := claimRetried(u); err != nil {
				t.Errorf("claim of %s in a storm: %v", u, err)
			}
		})
	}
	wg.Wait()
	if conns := clients(); conns-before > 2*32 {
		t.Errorf("%d connections on the master after 300 claims at once, %d before: want at most twice the pool's 32 more", conns, before)
	} else {
		t.Logf("%d connections on a master after 300 claims at once, %d before", conns, before)
	}

	if err := reps[0].Pause(); err != nil {
		t.Fatal(err)
	}
	for _, u := range on[:min(3, len(on))] {
		if err := claim(u); !errors.Is(err, tracker.ErrNotReplicated) {
			t.Errorf("claim of %s with its master's replica frozen: %v, want tracker.ErrNotReplicated", u, err)
		}
	}
	if err := claimRetried(off[0]); err != nil {
		t.Errorf("claim of %s on another master: %v", off[0], err)
	}
	if err := reps[0].Resume(); err != nil {
		t.Fatal(err)
	}
	testwait.NoErr(t, "a claim once the replica is back", func() error { return claim(on[0]) })

	if err := reps[0].Kill(); err != nil {
		t.Fatal(err)
	}
	testwait.NoErr(t, "a claim once the master has no replica left", func() error { return claim(on[0]) })
	start := time.Now()
	for _, u := range on {
		if err := claim(u); err != nil {
			t.Errorf("claim of %s, its master without replicas: %v", u, err)
		}
	}
	t.Logf("%d claims on a master without replicas in %v", len(on), time.Since(start))
}

// When what the store learnt of a master without replicas grows old,
// one claim asks again (ROLE) while the others go on as before: a storm
// of claims at that moment does not queue every claim for a dedicated
// connection. Redis is paused while they come, so that every claim finds
// the answer old. (One shard: the store learns the replicas per shard.)
func TestOneClaimAsksForTheReplicasAgain(t *testing.T) {
	t.Parallel()
	srv := testsvc.Redis(t)
	c := dial(t, srv.URL)
	ctx := t.Context()
	s := newStore(t, c, redisstore.Config{Rules: leaseRules, Shards: 1, EvictAfter: time.Hour})
	claim := func(user string) error {
		_, err := s.Claim(ctx, 1000, 5, user, tracker.OwnedDevice{ID: "d", LastBeat: 1000, LastActive: presence.Forever})
		return err
	}
	const n = 50
	users := make([]string, n)
	for i := range users {
		users[i] = fmt.Sprint("u", i)
		load(t, s, 1000, users[i])
	}
	if err := claim(users[0]); err != nil { // learns: no replicas
		t.Fatal(err)
	}
	s.AgeReplicaChecks()
	admin := dial(t, srv.URL)
	if err := admin.Do(ctx, admin.B().ConfigResetstat().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, admin.B().ClientPause().Timeout(300).All().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, u := range users[1:] {
		wg.Go(func() {
			if err := claim(u); err != nil {
				t.Errorf("claim of %s: %v", u, err)
			}
		})
	}
	wg.Wait()
	info, err := admin.Do(ctx, admin.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	roles := 0
	for _, line := range strings.Split(info, "\r\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_role:calls="); ok {
			roles, _ = strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
		}
	}
	if roles != 1 {
		t.Errorf("%d claims at once, the answer about the replicas old: %d ROLE asked, want 1", n-1, roles)
	}
	for _, u := range users {
		if st := get(t, s, 1000, u); st.Status != presence.Online {
			t.Errorf("%s after its claim: %v, want online", u, st.Status)
		}
	}
}
