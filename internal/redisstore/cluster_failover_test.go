package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/tracker"
)

// The failover tests run the store on a Redis Cluster of three masters,
// each with a replica (testsvc.RedisClusterReplicas), with users on every
// master, and take one master away: killed, so that its replica is
// elected in its place, or handed over cleanly by a manual failover.
// Neither loses a user's state, and a promoted replica, which never saw
// the store's scripts (Redis does not replicate its script cache), is
// sent them with EVAL on NOSCRIPT.

const (
	failoverUsers  = 60
	failoverShards = 256
	failoverT0     = int64(1_700_000_000_000)
	// failoverNow is the time of every call after the users came online:
	// their devices stay alive (TTL 30 s) and nothing falls due, so no
	// call changes them and their snapshots must stay as they were.
	failoverNow = failoverT0 + 1
	// failoverWait bounds every wait for the cluster or the client to
	// come round: generous, for a loaded machine; the tests take far less.
	failoverWait = 30 * time.Second
)

// failoverFixture is a store on a cluster with replicas, its users online
// and replicated.
type failoverFixture struct {
	cl     *testsvc.Cluster
	s      *redisstore.Store
	prefix string
	users  []string
	master map[string]*testsvc.Server   // each user's master
	before map[string]presence.Snapshot // each user's snapshot, online
}

func newFailoverFixture(t *testing.T) *failoverFixture {
	t.Helper()
	cl := testsvc.RedisClusterReplicas(t, 3, 1)
	c := dial(t, cl.URL)
	prefix := testsvc.Unique(t) + ":"
	f := &failoverFixture{cl: cl, prefix: prefix, master: map[string]*testsvc.Server{}, before: map[string]presence.Snapshot{}}
	// 64 buckets a shard from the start: too few users to split one, so
	// each stays where key names it.
	f.s = newStore(t, c, redisstore.Config{Prefix: prefix, Shards: failoverShards, Buckets: 64, EvictAfter: 1000 * time.Hour})
	ctx := t.Context()
	perMaster := map[*testsvc.Server]int{}
	for i := range failoverUsers {
		u := fmt.Sprint("u", i)
		f.users = append(f.users, u)
		if err := f.s.Load(ctx, failoverT0, &presence.Profile{UserID: u}); err != nil {
			t.Fatal(err)
		}
		if ch, err := f.s.Beat(ctx, failoverT0, u, "d", true); err != nil || !ch.Changed || ch.Event.Status != presence.Online {
			t.Fatalf("%s's first beat: %+v %v, want online", u, ch, err)
		}
		key := f.key(u)
		if n, err := c.Do(ctx, c.B().Hexists().Key(key).Field(u).Build()).AsInt64(); err != nil || n != 1 {
			t.Fatalf("HEXISTS %s %s: %d %v: the test's idea of the store's keys is wrong (see the package doc)", key, u, n, err)
		}
		m, err := cl.MasterOf(key)
		if err != nil {
			t.Fatal(err)
		}
		f.master[u] = m
		perMaster[m]++
	}
	if len(perMaster) != 3 {
		t.Fatalf("users on %d masters, want 3", len(perMaster))
	}
	out := make([]presence.Snapshot, len(f.users))
	if err := f.s.Get(ctx, failoverNow, f.users, out); err != nil {
		t.Fatal(err)
	}
	for i, u := range f.users {
		if !out[i].Known || out[i].Status != presence.Online || out[i].Devices != 1 {
			t.Fatalf("%s: %+v, want online with one device", u, out[i])
		}
		f.before[u] = out[i]
	}
	// Replication is asynchronous: make sure the replicas have it all
	// before a master goes.
	for m := range perMaster {
		if err := cl.WaitReplicated(m, failoverWait); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// key returns the key of user's bucket, as the package doc lays keys out
// (FNV-1a of the user id over the shards, then over the fixture's 64
// buckets); newFailoverFixture checks that the bucket holds the user.
func (f *failoverFixture) key(user string) string {
	return bucketKey(f.prefix, failoverShards, 64, user)
}

// bucketKey is the key of user's bucket in a store of prefix with shards
// shards of buckets buckets, as the package doc lays keys out: FNV-1a of
// the user id over the shards, then over the buckets. Tests that look at
// the keys themselves (which master holds a user) compute it apart from
// the store.
func bucketKey(prefix string, shards, buckets uint32, user string) string {
	h := fnv.New32a()
	h.Write([]byte(user))
	return fmt.Sprintf("%s{%d}p:%d", prefix, h.Sum32()%shards, h.Sum32()/shards%buckets)
}

// split returns the users whose master is m and the others.
func (f *failoverFixture) split(m *testsvc.Server) (on, off []string) {
	for _, u := range f.users {
		if f.master[u] == m {
			on = append(on, u)
		} else {
			off = append(off, u)
		}
	}
	return on, off
}

// check calls Beat for each of users and Get for them all. It returns
// the calls that failed and, apart, the answers that were wrong: a store
// that lost a user answers ErrNotLoaded (or ErrStoreReset, having lost
// its floor) or reads it as not known.
func (f *failoverFixture) check(ctx context.Context, users []string) (failed, wrong error) {
	var fails, wrongs []error
	for _, u := range users {
		ch, err := f.s.Beat(ctx, failoverNow, u, "d", true)
		switch {
		case errors.Is(err, tracker.ErrNotLoaded) || errors.Is(err, tracker.ErrStoreReset):
			wrongs = append(wrongs, fmt.Errorf("beat %s: %w", u, err))
		case err != nil:
			fails = append(fails, fmt.Errorf("beat %s: %w", u, err))
		case ch.Changed:
			wrongs = append(wrongs, fmt.Errorf("beat %s changed it: %+v", u, ch))
		}
	}
	out := make([]presence.Snapshot, len(users))
	if err := f.s.Get(ctx, failoverNow, users, out); err != nil {
		fails = append(fails, fmt.Errorf("get: %w", err))
		return joinSome(fails), joinSome(wrongs)
	}
	for i, u := range users {
		got, want := out[i], f.before[u]
		// Every beat moves the last seen times; nothing else may move.
		got.LastSeen, want.LastSeen, got.PubLastSeen, want.PubLastSeen = 0, 0, 0, 0
		if got != want {
			wrongs = append(wrongs, fmt.Errorf("get %s: %+v, want %+v", u, out[i], f.before[u]))
		}
	}
	return joinSome(fails), joinSome(wrongs)
}

// joinSome joins the first three of errs and counts the rest.
func joinSome(errs []error) error {
	if len(errs) > 3 {
		errs = append(errs[:3], fmt.Errorf("and %d more", len(errs)-3))
	}
	return errors.Join(errs...)
}

// isNoScript reports whether err says a node did not know a script.
func isNoScript(err error) bool {
	var re *rueidis.RedisError
	return errors.As(err, &re) && re.IsNoScript() || strings.Contains(err.Error(), "NOSCRIPT")
}

// failoverCallers call check for a set of users over and over, in goroutines
// of their own, each round with up to a timeout, until stop, and hand
// what each round found wrong to a report function.
type failoverCallers struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	rounds atomic.Int64 // rounds done
}

// startCallers starts callers, stopped at t's cleanup if not before.
func (f *failoverFixture) startCallers(t *testing.T, users []string, timeout time.Duration, report func(failed, wrong error)) *failoverCallers {
	ctx, cancel := context.WithCancel(context.Background())
	c := &failoverCallers{cancel: cancel}
	t.Cleanup(func() { c.stop() })
	for range 4 {
		c.wg.Go(func() {
			for ctx.Err() == nil {
				cctx, ccancel := context.WithTimeout(ctx, timeout)
				failed, wrong := f.check(cctx, users)
				ccancel()
				if ctx.Err() != nil {
					return // stopped in the middle: not the store's fault
				}
				c.rounds.Add(1)
				if failed != nil || wrong != nil {
					report(failed, wrong)
					time.Sleep(10 * time.Millisecond) // do not spin on a dead node
				}
			}
		})
	}
	return c
}

// waitRounds waits until the callers have done n more rounds, for at most
// failoverWait.
func (c *failoverCallers) waitRounds(t *testing.T, n int64) {
	t.Helper()
	want := c.rounds.Load() + n
	deadline := time.Now().Add(failoverWait)
	for c.rounds.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("callers did %d rounds in %v, want %d", c.rounds.Load()-want+n, failoverWait, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop stops the callers, waits for them and returns the rounds they did.
// It may be called again.
func (c *failoverCallers) stop() int64 {
	c.cancel()
	c.wg.Wait()
	return c.rounds.Load()
}

// waitCheck polls check for users until it passes, for at most
// failoverWait, and fails the test with the last error otherwise.
func (f *failoverFixture) waitCheck(t *testing.T, users []string, what string) {
	t.Helper()
	deadline := time.Now().Add(failoverWait)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		failed, wrong := f.check(ctx, users)
		cancel()
		if wrong != nil {
			t.Fatalf("%s: a wrong answer: %v", what, wrong)
		}
		if failed == nil {
			return
		}
		err := failed
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after %v: %v", what, failoverWait, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sweepAndCheckpoint runs Expire and Dirty, which call their scripts on
// every shard of every master, pipelined (EVALSHA, then EVAL where the
// node answers NOSCRIPT).
func (f *failoverFixture) sweepAndCheckpoint(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	if out, err := f.s.Expire(ctx, failoverNow, 100, nil); err != nil || len(out) != 0 {
		t.Errorf("Expire after the failover: %d changes, %v; want none", len(out), err)
	}
	if _, err := f.s.Dirty(ctx, nil); err != nil {
		t.Errorf("Dirty after the failover: %v", err)
	}
}

// noScriptErrors returns how many calls s answered NOSCRIPT.
func noScriptErrors(t *testing.T, s *testsvc.Server) int64 {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr}, ForceSingleClient: true,
		DisableCache: true, AlwaysRESP2: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info, err := c.Do(t.Context(), c.B().Info().Section("errorstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "errorstat_NOSCRIPT:count="); ok {
			n, err := strconv.ParseInt(rest, 10, 64)
			if err != nil {
				t.Fatalf("errorstats: %q: %v", line, err)
			}
			return n
		}
	}
	return 0
}

// TestClusterFailoverKillMaster: one master is killed. The users of the
// other masters are served throughout; the killed master's users fail
// (with an error, never a wrong answer) until its replica is elected, are
// served again after, and nothing written before the kill is lost.
func TestClusterFailoverKillMaster(t *testing.T) {
	t.Parallel()
	f := newFailoverFixture(t)
	victim := f.master[f.users[0]]
	reps, err := f.cl.ReplicasOf(victim)
	if err != nil {
		t.Fatal(err)
	}
	mine, others := f.split(victim)

	var othersFailed atomic.Int64
	othersCalls := f.startCallers(t, others, 5*time.Second, func(failed, wrong error) {
		if othersFailed.Add(1) <= 3 {
			t.Errorf("users of the masters still up: %v", errors.Join(failed, wrong))
		}
	})
	var mineFailed atomic.Int64
	mineCalls := f.startCallers(t, mine, time.Second, func(failed, wrong error) {
		mineFailed.Add(1)
		if wrong != nil {
			t.Errorf("users of the killed master, during the failover: a wrong answer: %v", wrong)
		}
	})

	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	f.checkPartialRead(t, mine)
	promoted, err := f.cl.WaitPromoted(victim, failoverWait)
	if err != nil {
		t.Fatal(err)
	}
	if promoted != reps[0] {
		t.Errorf("%s took over, want the replica %s", promoted.Addr, reps[0].Addr)
	}
	// The client learns the new layout from its next errors or MOVED.
	f.waitCheck(t, mine, "the killed master's users after the failover")
	mineRounds := mineCalls.stop()
	othersCalls.waitRounds(t, 4)
	othersRounds := othersCalls.stop()
	t.Logf("killed master's users: %d of %d rounds failed; other users: %d of %d rounds failed",
		mineFailed.Load(), mineRounds, othersFailed.Load(), othersRounds)

	// From now on every call succeeds, for every user.
	var afterFailed atomic.Int64
	after := f.startCallers(t, f.users, 5*time.Second, func(failed, wrong error) {
		if afterFailed.Add(1) <= 3 {
			t.Errorf("after the failover: %v", errors.Join(failed, wrong))
		}
	})
	after.waitRounds(t, 8)
	after.stop()
	f.sweepAndCheckpoint(t)
	if noScriptErrors(t, promoted) == 0 {
		t.Errorf("the promoted replica %s never answered NOSCRIPT: it knew the scripts, and the test proves nothing", promoted.Addr)
	}
}

// TestClusterFailoverManual: a manual failover (CLUSTER FAILOVER on a
// replica) while every user beats and is read: no call fails with
// NOSCRIPT although the new master never saw the scripts, and no state is
// lost, not even the changes made just before (the old master hands over
// every acknowledged write before it steps down).
func TestClusterFailoverManual(t *testing.T) {
	t.Parallel()
	f := newFailoverFixture(t)
	old := f.master[f.users[0]]
	reps, err := f.cl.ReplicasOf(old)
	if err != nil {
		t.Fatal(err)
	}
	replica := reps[0]
	mine, _ := f.split(old)
	// Changes the replica may not have yet (no WaitReplicated): the old
	// master hands them over before it steps down.
	ctx := t.Context()
	for _, u := range mine {
		if ch, err := f.s.SetStatus(ctx, failoverNow, u, presence.ManualBusy, "in a meeting"); err != nil || !ch.Changed {
			t.Fatalf("SetStatus %s: %+v %v, want a change", u, ch, err)
		}
	}
	out := make([]presence.Snapshot, len(mine))
	if err := f.s.Get(ctx, failoverNow, mine, out); err != nil {
		t.Fatal(err)
	}
	for i, u := range mine {
		if out[i].Status != presence.Busy || out[i].Version != f.before[u].Version+1 {
			t.Fatalf("%s after SetStatus: %+v, want busy at version %d", u, out[i], f.before[u].Version+1)
		}
		f.before[u] = out[i]
	}

	var noScript, failed atomic.Int64
	calls := f.startCallers(t, f.users, 5*time.Second, func(fail, wrong error) {
		failed.Add(1)
		if wrong != nil {
			t.Errorf("during a manual failover: a wrong answer: %v", wrong)
		}
		switch {
		case fail == nil:
		case isNoScript(fail):
			if noScript.Add(1) <= 3 {
				t.Errorf("during a manual failover: %v", fail)
			}
		default:
			t.Logf("during a manual failover: %v", fail)
		}
	})
	if err := f.cl.Failover(replica, failoverWait); err != nil {
		t.Fatal(err)
	}
	during := calls.rounds.Load()
	// Rounds that began after the failover too, so that several callers
	// run into the new master's NOSCRIPT at once.
	calls.waitRounds(t, 8)
	rounds := calls.stop()
	f.waitCheck(t, mine, "the old master's users after the failover")
	t.Logf("%d of %d rounds over all users failed (%d rounds done when the failover was over)", failed.Load(), rounds, during)

	if failed, wrong := f.check(t.Context(), f.users); failed != nil || wrong != nil {
		t.Errorf("after the failover: %v", errors.Join(failed, wrong))
	}
	f.sweepAndCheckpoint(t)
	if noScriptErrors(t, replica) == 0 {
		t.Errorf("the new master %s never answered NOSCRIPT: it knew the scripts, and the test proves nothing", replica.Addr)
	}
}

// checkPartialRead reads every user in one Get while the killed master's
// users (mine) cannot be read: the Get answers for the others and names
// mine in a tracker.PartialError (the tracker then reads only those
// degraded), until the client learns the new layout.
func (f *failoverFixture) checkPartialRead(t *testing.T, mine []string) {
	t.Helper()
	out := make([]presence.Snapshot, len(f.users))
	deadline := time.Now().Add(failoverWait)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		err := f.s.Get(ctx, failoverNow, f.users, out)
		cancel()
		var pe *tracker.PartialError
		if errors.As(err, &pe) {
			var failed []string
			for _, i := range pe.Failed {
				failed = append(failed, f.users[i])
			}
			if !sameSet(failed, mine) {
				t.Errorf("a read during the failover failed for %v, want the killed master's users %v", failed, mine)
			}
			for i, u := range f.users {
				if !slices.Contains(failed, u) && out[i].Status != presence.Online {
					t.Errorf("%s, on a master that is up, read %+v during the failover", u, out[i])
				}
			}
			// The floors of the shards that answer are there: the
			// tracker is neither told that the store lost its data nor
			// that it is down (the killed master's shards, if it is not
			// promoted yet, are named in a PartialError).
			ok, err := f.s.CheckFloor(t.Context())
			if !ok || err != nil && !errors.As(err, &pe) {
				t.Errorf("CheckFloor during the failover: %v, %v; want true and nil or a PartialError", ok, err)
			}
			return
		}
		if err == nil || time.Now().After(deadline) {
			// Promoted already (a fast failover): nothing partial to see.
			t.Logf("no partial read seen (err %v)", err)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
