package tracker_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/pgstore"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/sqlitestore"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tracker"
)

// redisRules are short, so a test plays expiry in seconds of fake time.
var redisRules = presence.Rules{TTL: 2 * time.Second, IdleAfter: time.Minute}

// TestRedisOutage stops (Redis comes back empty) or pauses (a hung server,
// state kept) a real Redis in the middle of a run: beats are buffered,
// reads answer from SQLite and the buffer, and after the recovery Redis
// holds every last beat, nobody beating goes offline, and a device that
// stopped during the outage goes offline once, after the grace, at its
// last beat.
func TestRedisOutage(t *testing.T) {
	for _, how := range []string{"stop", "pause"} {
		t.Run(how, func(t *testing.T) {
			srv := testsvc.Redis(t)
			c, err := redisstore.Dial(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			rs, err := redisstore.Open(context.Background(), c, redisstore.Config{Rules: redisRules})
			if err != nil {
				t.Fatal(err)
			}
			db, err := sqlitestore.Open(context.Background(), sqlitestore.Config{Path: filepath.Join(t.TempDir(), "p.db")})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			sw := &switchStore{s: rs}
			f := &fixture{t: t, ctx: context.Background(), clock: clock.NewFake(start), pub: &recorder{}}
			f.tr, err = tracker.New(tracker.Config{
				Store: pingStore{sw}, Durable: db, Publisher: f.pub, Clock: f.clock, Rules: redisRules,
				StoreTimeout: 300 * time.Millisecond, ProbeInterval: 20 * time.Millisecond,
				SweepInterval: time.Hour, FlushInterval: time.Hour,
			})
			if err != nil {
				t.Fatal(err)
			}
			runTracker(t, f.tr)

			hidden := presence.Settings{Status: presence.Contacts, LastSeen: presence.Nobody}
			if err := f.tr.SetSettings(f.ctx, "h", hidden); err != nil {
				t.Fatal(err)
			}
			for _, u := range []string{"a", "b", "c", "h"} {
				f.beat(u, "d", true)
			}
			f.at(100 * time.Millisecond)
			f.bye("c", "d")
			if err := f.tr.Checkpoint(f.ctx); err != nil {
				t.Fatal(err)
			}
			// n comes online after the checkpoint: Redis alone knows the
			// version of that change when it goes away.
			f.at(200 * time.Millisecond)
			f.beat("n", "d", true)
			before := map[string]uint64{} // the newest version published of each user
			for _, e := range f.pub.take() {
				before[e.UserID] = max(before[e.UserID], e.Version)
			}

			resume := srv.Start
			if how == "stop" {
				err = srv.Stop()
			} else {
				err, resume = srv.Pause(), srv.Resume
			}
			if err != nil {
				t.Fatal(err)
			}
			f.at(500 * time.Millisecond)
			f.beat("a", "d", true) // meets the outage: buffered, no error
			if s := f.tr.Stats(); !s.Down {
				t.Fatalf("the store is not down after a failed beat")
			}
			calls := sw.calls.Load()
			f.at(time.Second)
			for _, u := range []string{"a", "b", "h"} {
				f.beat(u, "d", true) // b's last beat
			}
			f.beat("n", "d", true)
			f.at(1500 * time.Millisecond)
			f.beat("a", "d", true)
			f.beat("h", "d", true)
			got := f.read("a", "b", "c", "h", "nobody")
			if n := sw.calls.Load() - calls; n != 0 {
				t.Errorf("%d store operations after the outage was detected, want 0", n)
			}
			for i, want := range []struct {
				status   presence.Status
				seen     time.Duration
				settings presence.Settings
				known    bool
			}{
				{presence.Online, 1500 * time.Millisecond, presence.Settings{}, true},
				{presence.Online, time.Second, presence.Settings{}, true},
				{presence.Offline, 100 * time.Millisecond, presence.Settings{}, true},
				{presence.Online, 1500 * time.Millisecond, hidden, true},
				{presence.Offline, -1, presence.Settings{}, false},
			} {
				s := got[i]
				seen := ms(want.seen)
				if !want.known {
					seen = 0
				}
				if s.Known != want.known || s.Status != want.status || s.LastSeen != seen || s.Settings != want.settings {
					t.Errorf("degraded read of %q: %+v, want known=%v %v seen=%v settings=%+v",
						s.UserID, s, want.known, want.status, want.seen, want.settings)
				}
			}

			if err := resume(); err != nil {
				t.Fatal(err)
			}
			f.waitUp()
			for user, want := range map[string]time.Duration{"a": 1500 * time.Millisecond, "b": time.Second, "h": 1500 * time.Millisecond} {
				u := f.debug(user)
				if u.LastSeen != ms(want) || lastBeat(u, "d") != ms(want) {
					t.Errorf("Redis holds %s with last_seen %v and last beat %v, want %v", user, offset(u.LastSeen), offset(lastBeat(u, "d")), want)
				}
				if u.Settings != (presence.Settings{}) && user != "h" || user == "h" && u.Settings != hidden {
					t.Errorf("Redis holds %s with settings %+v", user, u.Settings)
				}
			}
			wantResets := map[string]uint64{"stop": 1, "pause": 0}[how]
			if s := f.tr.Stats(); s.StoreResets != wantResets {
				t.Errorf("store resets %d, want %d (Redis %s)", s.StoreResets, wantResets, how)
			}
			offline := func() []string {
				var out []string
				for _, e := range f.pub.take() {
					// No version published before the outage comes again,
					// also when Redis lost the change that made it.
					if e.Version <= before[e.UserID] {
						t.Errorf("%s published at version %d after the outage; it published %d before",
							e.UserID, e.Version, before[e.UserID])
					}
					if e.Status == presence.Offline {
						out = append(out, fmtEvents([]presence.Event{e})...)
					}
				}
				return out
			}
			if evs := offline(); len(evs) > 0 {
				t.Errorf("offline events at the recovery: %v", evs)
			}
			// b's device dies at 3s; the grace ends 2s after the recovery
			// (at 1.5s of the fake clock).
			f.at(3200 * time.Millisecond)
			f.beat("a", "d", true)
			f.beat("h", "d", true)
			f.sweep()
			if evs := offline(); len(evs) > 0 {
				t.Errorf("offline events within the grace: %v", evs)
			}
			f.at(3600 * time.Millisecond)
			f.beat("a", "d", true)
			f.beat("h", "d", true)
			f.sweep()
			f.sweep()
			evs := offline()
			slices.Sort(evs)
			if want := []string{"b online→offline seen=1s", "n online→offline seen=1s"}; !slices.Equal(evs, want) {
				t.Errorf("offline events after the grace: %v, want %v", evs, want)
			}
			if err := f.tr.Checkpoint(f.ctx); err != nil {
				t.Fatal(err)
			}
			seen := map[string]int64{}
			if err := db.LoadProfiles(f.ctx, []string{"a", "b"}, func(p *presence.Profile) { seen[p.UserID] = p.LastSeen }); err != nil {
				t.Fatal(err)
			}
			if seen["a"] != ms(3600*time.Millisecond) || seen["b"] != ms(time.Second) {
				t.Errorf("durable last_seen a=%v b=%v, want 3.6s, 1s", offset(seen["a"]), offset(seen["b"]))
			}
		})
	}
}

// TestInvisibleTextAfterDataLoss: an invisible user sets a text while
// Redis is down; Redis comes back empty and the user is reloaded from
// SQLite, where the status was written at once. Nobody else reads that
// text — not while Redis is down, not after the reload (which Redis then
// keeps), not from what is checkpointed next — only the user. Others read
// the text the user vanished with if a checkpoint carried it before
// Redis went away, the one before otherwise (presence.Profile.SaveStatus).
func TestInvisibleTextAfterDataLoss(t *testing.T) {
	for _, tc := range []struct {
		name       string
		checkpoint bool
		want       string
	}{
		{"checkpointed", true, "lunch"},
		{"not checkpointed", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) { testInvisibleTextAfterDataLoss(t, tc.checkpoint, tc.want) })
	}
}

func testInvisibleTextAfterDataLoss(t *testing.T, checkpoint bool, want string) {
	srv := testsvc.Redis(t)
	c, err := redisstore.Dial(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	rs, err := redisstore.Open(context.Background(), c, redisstore.Config{Rules: redisRules})
	if err != nil {
		t.Fatal(err)
	}
	db, err := sqlitestore.Open(context.Background(), sqlitestore.Config{Path: filepath.Join(t.TempDir(), "p.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	f := &fixture{t: t, ctx: context.Background(), clock: clock.NewFake(start), pub: &recorder{}}
	f.tr, err = tracker.New(tracker.Config{
		Store: pingStore{&switchStore{s: rs}}, Durable: db, Publisher: f.pub, Clock: f.clock, Rules: redisRules,
		StoreTimeout: 300 * time.Millisecond, ProbeInterval: 20 * time.Millisecond,
		SweepInterval: time.Hour, FlushInterval: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	runTracker(t, f.tr)
	f.beat("u", "d", true)
	f.status("u", presence.ManualInvisible, "lunch")
	if checkpoint {
		if err := f.tr.Checkpoint(f.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	f.at(500 * time.Millisecond)
	f.beat("u", "d", true) // meets the outage: buffered
	f.status("u", presence.ManualInvisible, "at the clinic")
	check := func(when string) {
		t.Helper()
		s := f.read("u")[0]
		if v := privacy.Filter(privacy.Relation{}, &s); v.Status != presence.Offline || v.Text != want {
			t.Errorf("%s: others read %s %q, want offline %q", when, v.Status, v.Text, want)
		}
		if v := privacy.Filter(privacy.Relation{Self: true}, &s); v.Text != "at the clinic" {
			t.Errorf("%s: the user reads %q, want %q", when, v.Text, "at the clinic")
		}
	}
	check("Redis down")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	f.waitUp()
	if s := f.tr.Stats(); s.StoreResets != 1 {
		t.Errorf("store resets %d, want 1 (Redis came back empty)", s.StoreResets)
	}
	check("reloaded")
	if u := f.debug("u"); u.PubText != want || u.Text != "at the clinic" {
		t.Errorf("Redis holds the public text %q and the user's %q, want %q and %q", u.PubText, u.Text, want, "at the clinic")
	}
	if err := f.tr.Checkpoint(f.ctx); err != nil {
		t.Fatal(err)
	}
	if err := db.LoadProfiles(f.ctx, []string{"u"}, func(p *presence.Profile) {
		if text, _ := p.Public(); text != want || p.Text != "at the clinic" {
			t.Errorf("checkpointed: public text %q, the user's %q; want %q and %q", text, p.Text, want, "at the clinic")
		}
	}); err != nil {
		t.Fatal(err)
	}
}

// TestInvisibleTextAfterACrash: the embedded node (memory and SQLite)
// dies before the checkpoint of an invisible user's new text; the node
// that starts again on the same file shows everyone else the text the
// user vanished with (the one before if no checkpoint carried it) — read
// cold from the file, and once the user's device is back — and the user
// theirs.
func TestInvisibleTextAfterACrash(t *testing.T) {
	for _, tc := range []struct {
		name       string
		checkpoint bool
		want       string
	}{
		{"checkpointed", true, "lunch"},
		{"not checkpointed", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) { testInvisibleTextAfterACrash(t, tc.checkpoint, tc.want) })
	}
}

func testInvisibleTextAfterACrash(t *testing.T, checkpoint bool, want string) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "p.db")
	open := func() (*sqlitestore.Store, *fixture) {
		db, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		epoch, err := db.NextEpoch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r := rules
		r.Epoch = epoch
		f := &fixture{t: t, ctx: ctx, clock: clock.NewFake(start), pub: &recorder{}}
		f.tr, err = tracker.New(tracker.Config{Store: memstore.New(memstore.Config{Rules: r}), Durable: db,
			Publisher: f.pub, Clock: f.clock, Rules: r, SweepInterval: time.Hour, FlushInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return db, f
	}
	db, f := open()
	f.beat("u", "d", true)
	f.status("u", presence.ManualInvisible, "lunch")
	if checkpoint {
		if err := f.tr.Checkpoint(ctx); err != nil {
			t.Fatal(err)
		}
	}
	f.at(time.Second)
	f.status("u", presence.ManualInvisible, "at the clinic")
	// The crash: the hot state is gone, the last checkpoint never made.
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, f = open()
	defer db.Close()
	check := func(when string, s presence.Snapshot) {
		t.Helper()
		if v := privacy.Filter(privacy.Relation{}, &s); v.Status != presence.Offline || v.Text != want {
			t.Errorf("%s: others read %s %q, want offline %q", when, v.Status, v.Text, want)
		}
		if v := privacy.Filter(privacy.Relation{Self: true}, &s); v.Text != "at the clinic" {
			t.Errorf("%s: the user reads %q, want %q", when, v.Text, "at the clinic")
		}
	}
	if err := db.LoadProfiles(ctx, []string{"u"}, func(p *presence.Profile) {
		check("read cold", presence.SnapshotFromProfile(p))
	}); err != nil {
		t.Fatal(err)
	}
	f.at(2 * time.Second)
	if ch := f.beat("u", "d", true); ch.Changed {
		t.Errorf("the device back: published %+v, want nothing (the user is invisible)", ch.Event)
	}
	check("the device back", f.read("u")[0])
}

// TestCheckpointPostgresOutage: while PostgreSQL is stopped checkpoints
// fail and are counted; once it is back the next one writes every
// last_seen, none lost, each user once.
func TestCheckpointPostgresOutage(t *testing.T) {
	srv := testsvc.Postgres(t)
	ctx := context.Background()
	pg, err := pgstore.Open(ctx, pgstore.Config{URL: srv.NewDatabase(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	clk := clock.NewFake(start)
	tr, err := tracker.New(tracker.Config{Store: memstore.New(memstore.Config{Rules: rules}), Durable: pg, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	users := make([]string, 50)
	for i := range users {
		users[i] = fmt.Sprintf("u%02d", i)
	}
	beat := func(at time.Duration, users []string) {
		clk.Set(start.Add(at))
		for _, u := range users {
			if _, err := tr.Heartbeat(ctx, u, "d", true); err != nil {
				t.Fatal(err)
			}
		}
	}
	beat(0, users)
	if err := tr.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	down, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	beat(time.Second, users)
	if err := tr.Checkpoint(down); err == nil {
		t.Fatal("a checkpoint while PostgreSQL is stopped: nil error")
	}
	beat(2*time.Second, users[:25])
	if err := tr.Checkpoint(down); err == nil {
		t.Fatal("a second checkpoint while PostgreSQL is stopped: nil error")
	}
	if s := tr.Stats(); s.FlushErrors != 2 {
		t.Errorf("FlushErrors = %d, want 2", s.FlushErrors)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Checkpoint(ctx); err != nil {
		t.Fatalf("the checkpoint after PostgreSQL is back: %v", err)
	}
	if s := tr.Stats(); s.Flushed != 100 {
		t.Errorf("Flushed = %d, want 100 (50 users twice)", s.Flushed)
	}
	seen := map[string]int64{}
	if err := pg.LoadProfiles(ctx, users, func(p *presence.Profile) { seen[p.UserID] = p.LastSeen }); err != nil {
		t.Fatal(err)
	}
	for i, u := range users {
		want := ms(time.Second)
		if i < 25 {
			want = ms(2 * time.Second)
		}
		if seen[u] != want {
			t.Errorf("durable last_seen of %s = %v, want %v", u, offset(seen[u]), offset(want))
		}
	}
}

// TestHeartbeatsWhilePostgresIsDown: with PostgreSQL stopped, users who are
// not in Redis beat (their profiles cannot be loaded): every heartbeat and
// bye is accepted, nothing of them is shown or published, and operations
// that need the profile fail as Unavailable. Once PostgreSQL is back each
// user is loaded with its real profile: an invisible user stays invisible
// (no event; its public last_seen stays frozen), a user whose settings say
// nobody is published with those settings, versions count on above the
// durable ones plus the reload margin (never repeating one published
// before), and devices that ended during the outage are never announced —
// they only move last_seen forward.
func TestHeartbeatsWhilePostgresIsDown(t *testing.T) {
	pgSrv := testsvc.Postgres(t)
	ctx := context.Background()
	pg, err := pgstore.Open(ctx, pgstore.Config{URL: pgSrv.NewDatabase(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	c, err := redisstore.Dial(testsvc.Redis(t).URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	r := redisRules
	if r.Epoch, err = pg.NextEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	rs, err := redisstore.New(c, redisstore.Config{Rules: r})
	if err != nil {
		t.Fatal(err)
	}
	const margin = 1 << 16
	f := &fixture{t: t, ctx: ctx, clock: clock.NewFake(start), pub: &recorder{}}
	f.tr, err = tracker.New(tracker.Config{
		Store: rs, Durable: pg, Publisher: f.pub, Clock: f.clock, Rules: r, ReloadMargin: margin,
		ProbeInterval: 20 * time.Millisecond, SweepInterval: time.Hour, FlushInterval: time.Hour,
		LoadTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}

	// Durable profiles of earlier runs (their versions were published).
	old := ms(-time.Hour)
	nobody := presence.Settings{Status: presence.Nobody, LastSeen: presence.Nobody}
	for _, u := range []string{"inv", "invgone"} {
		if err := pg.SaveStatus(ctx, u, presence.ManualInvisible, ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := pg.SaveSettings(ctx, "hid", nobody); err != nil {
		t.Fatal(err)
	}
	durableVersion := r.Epoch<<32 - 1000 // a run before this one
	var seed []presence.Profile
	for _, u := range []string{"inv", "invgone", "hid", "pub", "gone", "byer"} {
		seed = append(seed, presence.Profile{UserID: u, LastSeen: old, PubLastSeen: old, Version: durableVersion})
	}
	if err := pg.SaveLastSeen(ctx, seed); err != nil {
		t.Fatal(err)
	}

	if err := pgSrv.Stop(); err != nil {
		t.Fatal(err)
	}
	runTracker(t, f.tr)
	users := []string{"inv", "invgone", "hid", "pub", "gone", "byer", "new"}
	f.at(500 * time.Millisecond)
	for _, u := range users {
		if ch := f.beat(u, "d", true); ch.Changed {
			t.Errorf("%s's heartbeat while PostgreSQL is down changed %+v", u, ch.Event)
		}
	}
	f.at(time.Second)
	f.beat("pub", "d", true)
	f.bye("byer", "d")
	if s := f.tr.Stats(); s.AwaitingProfile != int64(len(users)) {
		t.Errorf("Stats.AwaitingProfile = %d, want %d", s.AwaitingProfile, len(users))
	}
	got := f.read(users...)
	for _, s := range got {
		if s.Known {
			t.Errorf("%s reads %+v while its profile is unknown; want unknown (nothing made up)", s.UserID, s)
		}
	}
	if _, err := f.tr.SetStatus(ctx, "pub", presence.ManualBusy, ""); err == nil || !tracker.Unavailable(err) {
		t.Errorf("SetStatus while PostgreSQL is down: %v, want Unavailable", err)
	}
	f.wantEvents("while PostgreSQL is down")

	// Still down at 3s: devices beat again; gone's and invgone's died at
	// 2.5s (ttl 2s), byer's said bye.
	f.at(3 * time.Second)
	for _, u := range []string{"inv", "hid", "pub", "new"} {
		f.beat(u, "d", true)
	}
	if err := pgSrv.Start(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "every waiting user to be loaded", func() bool { return f.tr.Stats().AwaitingProfile == 0 })

	evs := f.pub.take()
	byUser := map[string]presence.Event{}
	for _, e := range evs {
		if _, dup := byUser[e.UserID]; dup {
			t.Errorf("two events of %s: %v", e.UserID, fmtEvents(evs))
		}
		byUser[e.UserID] = e
	}
	if len(byUser) != 3 {
		t.Errorf("events after PostgreSQL came back: %v; want one each of hid, pub and new", fmtEvents(evs))
	}
	for _, u := range []string{"hid", "pub", "new"} {
		e, ok := byUser[u]
		if !ok || e.Prev != presence.Offline || e.Status != presence.Online || e.LastSeen != ms(3*time.Second) {
			t.Errorf("%s's event: %v, want offline→online seen=3s", u, fmtEvents([]presence.Event{e}))
		}
		floor := durableVersion + margin // above anything a lost Redis may have published
		if u == "new" {
			floor = r.Epoch << 32
		}
		if e.Version <= floor {
			t.Errorf("%s's event has version %d, want above %d", u, e.Version, floor)
		}
	}
	if s := byUser["hid"].Settings; s != nobody {
		t.Errorf("hid's event carries settings %+v, want %+v (the durable ones)", s, nobody)
	}
	if s := byUser["pub"].Settings; s != (presence.Settings{}) {
		t.Errorf("pub's event carries settings %+v", s)
	}

	u := f.debug("inv")
	if u.Manual != presence.ManualInvisible || u.PubLastSeen != old || lastBeat(u, "d") != ms(3*time.Second) {
		t.Errorf("inv in Redis: manual %v, public last_seen %v, last beat %v; want invisible, frozen at -1h, 3s",
			u.Manual, offset(u.PubLastSeen), offset(lastBeat(u, "d")))
	}
	if u := f.debug("pub"); u.Version <= durableVersion+margin {
		t.Errorf("pub in Redis has version %d, want above %d", u.Version, durableVersion+margin)
	}
	for _, gone := range []string{"gone", "invgone", "byer"} {
		if _, _, held, err := f.tr.Debug(ctx, gone); err != nil || held {
			t.Errorf("%s, whose device ended during the outage, is in Redis (%v, %v)", gone, held, err)
		}
	}
	durable := map[string]presence.Profile{}
	if err := pg.LoadProfiles(ctx, []string{"gone", "invgone", "byer"}, func(p *presence.Profile) { durable[p.UserID] = *p }); err != nil {
		t.Fatal(err)
	}
	for user, want := range map[string][2]int64{
		"gone":    {ms(500 * time.Millisecond), ms(500 * time.Millisecond)},
		"byer":    {ms(time.Second), ms(time.Second)},
		"invgone": {ms(500 * time.Millisecond), old}, // invisible: the public last_seen stays frozen
	} {
		p := durable[user]
		if p.LastSeen != want[0] || p.PubLastSeen != want[1] || p.Version != durableVersion {
			t.Errorf("durable %s: last_seen %v, public %v, version %d; want %v, %v, %d",
				user, offset(p.LastSeen), offset(p.PubLastSeen), p.Version, offset(want[0]), offset(want[1]), durableVersion)
		}
	}

	// Back to normal: the next beat of a loaded user changes nothing.
	f.at(3500 * time.Millisecond)
	if ch := f.beat("pub", "d", true); ch.Changed {
		t.Errorf("a beat after the recovery changed %+v", ch.Event)
	}
	if s := f.tr.Stats(); s.ProfilesLoaded != uint64(len(users)) {
		t.Errorf("Stats.ProfilesLoaded = %d, want %d", s.ProfilesLoaded, len(users))
	}
}

// TestLoadsResumeAfterPostgresReturns: a status change of a user not in
// the state store while PostgreSQL is stopped fails as Unavailable and
// makes loads fail fast; with nobody waiting for a profile, Run still
// finds PostgreSQL back, and the same change then succeeds.
func TestLoadsResumeAfterPostgresReturns(t *testing.T) {
	srv := testsvc.Postgres(t)
	ctx := context.Background()
	pg, err := pgstore.Open(ctx, pgstore.Config{URL: srv.NewDatabase(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	tr, err := tracker.New(tracker.Config{Store: memstore.New(memstore.Config{Rules: rules}), Durable: pg,
		Clock: clock.NewFake(start), ProbeInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runTracker(t, tr)
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.SetStatus(ctx, "u", presence.ManualBusy, ""); !tracker.Unavailable(err) {
		t.Fatalf("SetStatus while PostgreSQL is stopped: %v, want Unavailable", err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "a status change to succeed", func() bool {
		_, err := tr.SetStatus(ctx, "u", presence.ManualBusy, "")
		return err == nil
	})
}
