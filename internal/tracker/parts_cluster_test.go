package tracker_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/sqlitestore"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/tracker"
)

// A master of a Redis Cluster (three masters, each with a replica) is
// killed under a tracker whose users beat on every master: the store is
// never down as a whole; the users of the other masters are written to
// Redis and their changes published at once; the killed master's users'
// writes are accepted and buffered, and replayed once its replica is
// promoted; nobody who kept beating goes offline.
func TestClusterMasterDownAffectsOnlyItsUsers(t *testing.T) {
	t.Parallel()
	cl := testsvc.RedisClusterReplicas(t, 3, 1)
	c, err := redisstore.Dial(cl.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	prefix := testsvc.Unique(t) + ":"
	rs, err := redisstore.Open(context.Background(), c, redisstore.Config{Rules: redisRules, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if rs.Parts() < 2 {
		t.Fatalf("a store on a Cluster has %d parts", rs.Parts())
	}
	db, err := sqlitestore.Open(context.Background(), sqlitestore.Config{Path: filepath.Join(t.TempDir(), "p.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	f := &fixture{t: t, ctx: context.Background(), clock: clock.NewFake(start), pub: &recorder{}}
	f.tr, err = tracker.New(tracker.Config{
		Store: rs, Durable: db, Publisher: f.pub, Clock: f.clock, Rules: redisRules,
		StoreTimeout: 500 * time.Millisecond, ProbeInterval: 50 * time.Millisecond,
		// Sweeps, checkpoints and the check of the floors run during the
		// failover too: none may take the whole store down.
		SweepInterval: 100 * time.Millisecond, FlushInterval: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	runTracker(t, f.tr)

	master := map[string]*testsvc.Server{}
	var users []string
	for i := range 30 {
		u := fmt.Sprint("u", i)
		users = append(users, u)
		f.beat(u, "d", true)
		m, err := cl.MasterOf(prefix + "{" + strconv.Itoa(rs.Part(u)) + "}u:" + u)
		if err != nil {
			t.Fatal(err)
		}
		master[u] = m
	}
	victim := master[users[0]]
	var mine, others []string
	for _, u := range users {
		if master[u] == victim {
			mine = append(mine, u)
		} else {
			others = append(others, u)
		}
	}
	if len(others) == 0 {
		t.Fatal("every user on one master")
	}
	f.pub.take()
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()

	// Until the replica is promoted: every beat is accepted; the store is
	// never down as a whole.
	step := 0
	sawPartDown := false
	promoted := make(chan error, 1)
	go func() { _, err := cl.WaitPromoted(victim, time.Minute); promoted <- err }()
	statusSet := false
	for waiting := true; waiting; {
		select {
		case err := <-promoted:
			if err != nil {
				t.Fatal(err)
			}
			waiting = false
		case <-time.After(100 * time.Millisecond):
		}
		step++
		f.at(time.Duration(step) * 100 * time.Millisecond)
		for _, u := range users {
			f.beat(u, "d", true)
		}
		st := f.tr.Stats()
		if st.Down {
			t.Fatalf("%s after the kill the whole store is down: %+v", time.Since(killed).Round(time.Millisecond), st)
		}
		if st.PartsDown > 0 && !statusSet {
			sawPartDown = true
			statusSet = true
			// A status of a user of a master that answers is published
			// at once; one of the killed master's waits in the buffer.
			f.status(others[0], presence.ManualBusy, "")
			f.status(mine[0], presence.ManualBusy, "")
			f.wantEvents("during the failover", fmt.Sprintf("%s online→busy seen=%v", others[0], offset(f.tr.Now())))
		}
	}
	if !sawPartDown {
		t.Fatal("no part of the store was found down after its master was killed")
	}
	// After the promotion the killed master's users' buffer is replayed.
	deadline := time.Now().Add(time.Minute)
	for f.tr.Stats().PartsDown > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("parts still down a minute after the promotion: %+v", f.tr.Stats())
		}
		step++
		f.at(time.Duration(step) * 100 * time.Millisecond)
		for _, u := range users {
			f.beat(u, "d", true)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var replayed []string
	for _, e := range f.pub.take() {
		replayed = append(replayed, e.UserID+" "+e.Status.String())
		if e.Status == presence.Offline {
			t.Errorf("%s announced offline: it kept beating", e.UserID)
		}
	}
	if !slicesContains(replayed, mine[0]+" busy") {
		t.Errorf("after the promotion: published %v, want %s busy (replayed)", replayed, mine[0])
	}
	got := f.read(users...)
	for i, s := range got {
		want := presence.Online
		if users[i] == mine[0] || users[i] == others[0] {
			want = presence.Busy
		}
		if s.Status != want {
			t.Errorf("%s reads %v after the failover, want %v", users[i], s.Status, want)
		}
	}
	t.Logf("%d of %d users on the killed master; failover took %s; stats %+v", len(mine), len(users),
		time.Since(killed).Round(time.Millisecond), f.tr.Stats())
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// A batch read of users of every shard fails as a whole — cut by its
// deadline while every master was slow (paused), one of them dead
// (killed) — and the others answer again right after: only the dead
// master's shards are counted down, not every shard the read touched.
func TestWholeReadFailureCountsOnlyThePartsThatFailed(t *testing.T) {
	t.Parallel()
	cl := testsvc.RedisClusterReplicas(t, 3, 1)
	c, err := redisstore.Dial(cl.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	prefix := testsvc.Unique(t) + ":"
	rs, err := redisstore.Open(context.Background(), c, redisstore.Config{Rules: redisRules, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	db, err := sqlitestore.Open(context.Background(), sqlitestore.Config{Path: filepath.Join(t.TempDir(), "p.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	f := &fixture{t: t, ctx: context.Background(), clock: clock.NewFake(start), pub: &recorder{}}
	// Not run: no sweep or check of the floors marks a part down while
	// the masters are paused; the test probes as Run would.
	f.tr, err = tracker.New(tracker.Config{
		Store: rs, Durable: db, Publisher: f.pub, Clock: f.clock, Rules: redisRules,
		StoreTimeout: 300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	// One user of every shard; the masters, and the shards of the victim.
	users := make([]string, rs.Parts())
	for i := 0; slices.Contains(users, ""); i++ {
		if u := fmt.Sprint("u", i); users[rs.Part(u)] == "" {
			users[rs.Part(u)] = u
		}
	}
	masterOf := make([]*testsvc.Server, rs.Parts())
	for p := range masterOf {
		if masterOf[p], err = cl.MasterOf(prefix + "{" + strconv.Itoa(p) + "}"); err != nil {
			t.Fatal(err)
		}
	}
	victim := masterOf[0]
	var masters []*testsvc.Server
	victims := 0
	for _, m := range masterOf {
		if !slices.Contains(masters, m) {
			masters = append(masters, m)
		}
		if m == victim {
			victims++
		}
	}
	f.read(users...)
	if st := f.tr.Stats(); st.PartsDown != 0 || st.PartOutages != 0 {
		t.Fatalf("before: %+v", st)
	}

	for _, m := range masters {
		if m != victim {
			if err := m.Pause(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	f.read(users...) // degraded: every user from the durable store
	for _, m := range masters {
		if m != victim {
			if err := m.Resume(); err != nil {
				t.Fatal(err)
			}
		}
	}
	f.tr.ProbeSuspects(f.ctx)
	st := f.tr.Stats()
	if st.PartsDown != victims || st.PartOutages != uint64(victims) || st.Down {
		t.Errorf("after the read: %d parts down, %d outages (store down %v), want the %d of the killed master's of %d",
			st.PartsDown, st.PartOutages, st.Down, victims, rs.Parts())
	}
	// Reads of the other masters' users go to Redis again.
	var others []string
	for p, u := range users {
		if masterOf[p] != victim {
			others = append(others, u)
		}
	}
	before := f.tr.Stats().DegradedReads
	f.read(others...)
	if got := f.tr.Stats().DegradedReads; got != before {
		t.Errorf("a read of the other masters' users was degraded (%d → %d)", before, got)
	}
}
