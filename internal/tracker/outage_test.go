package tracker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tracker"
)

var errStoreGone = errors.New("connection refused")

// switchStore is a tracker.Store over a real one that can be switched
// off, as a store whose server went away: every call then fails. It counts
// the calls that reach it but Get (the tracker's probe when the store has
// no Ping), and may run a hook before each Beat.
type switchStore struct {
	s     tracker.Store
	off   atomic.Bool
	calls atomic.Int64
	gets  atomic.Int64
	// offAtStatus switches the store off at the next SetStatus call, which
	// fails: the store goes away just then.
	offAtStatus atomic.Bool

	mu         sync.Mutex // guards beforeBeat
	beforeBeat func(now int64, user, device string)
}

var _ tracker.Store = (*switchStore)(nil)

func (s *switchStore) call() error {
	s.calls.Add(1)
	if s.off.Load() {
		return errStoreGone
	}
	return nil
}

func (s *switchStore) setBeforeBeat(f func(now int64, user, device string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.beforeBeat = f
}

func (s *switchStore) Beat(ctx context.Context, now int64, user, device string, active bool) (presence.Change, error) {
	s.mu.Lock()
	f := s.beforeBeat
	s.mu.Unlock()
	if f != nil {
		f(now, user, device)
	}
	if err := s.call(); err != nil {
		return presence.Change{}, err
	}
	return s.s.Beat(ctx, now, user, device, active)
}

func (s *switchStore) SetStatus(ctx context.Context, now int64, user string, m presence.Manual, text string) (presence.Change, error) {
	if s.offAtStatus.Swap(false) {
		s.off.Store(true)
	}
	if err := s.call(); err != nil {
		return presence.Change{}, err
	}
	return s.s.SetStatus(ctx, now, user, m, text)
}

func (s *switchStore) Bye(ctx context.Context, now int64, user, device string) (presence.Change, error) {
	if err := s.call(); err != nil {
		return presence.Change{}, err
	}
	return s.s.Bye(ctx, now, user, device)
}

func (s *switchStore) Disconnect(ctx context.Context, now int64, user, device string, since int64) (presence.Change, error) {
	if err := s.call(); err != nil {
		return presence.Change{}, err
	}
	return s.s.Disconnect(ctx, now, user, device, since)
}

func (s *switchStore) SetSettings(ctx context.Context, now int64, user string, set *presence.Settings) (presence.Change, error) {
	if err := s.call(); err != nil {
		return presence.Change{}, err
	}
	return s.s.SetSettings(ctx, now, user, set)
}

func (s *switchStore) Load(ctx context.Context, now int64, p *presence.Profile) error {
	if err := s.call(); err != nil {
		return err
	}
	return s.s.Load(ctx, now, p)
}

func (s *switchStore) Expire(ctx context.Context, now int64, max int, out []presence.Change) ([]presence.Change, error) {
	if err := s.call(); err != nil {
		return out, err
	}
	return s.s.Expire(ctx, now, max, out)
}

func (s *switchStore) Get(ctx context.Context, now int64, ids []string, out []presence.Snapshot) error {
	s.gets.Add(1)
	if s.off.Load() {
		return errStoreGone
	}
	return s.s.Get(ctx, now, ids, out)
}

func (s *switchStore) Dirty(ctx context.Context, out []presence.Profile) ([]presence.Profile, error) {
	if err := s.call(); err != nil {
		return out, err
	}
	return s.s.Dirty(ctx, out)
}

func (s *switchStore) Debug(ctx context.Context, user string) (presence.User, int64, bool, error) {
	if err := s.call(); err != nil {
		return presence.User{}, 0, false, err
	}
	return s.s.Debug(ctx, user)
}

// RaiseFloor and CheckFloor pass to a Floorer store; over another store
// the floor is always there.
func (s *switchStore) RaiseFloor(ctx context.Context, floor uint64) error {
	if err := s.call(); err != nil {
		return err
	}
	if f, ok := s.s.(tracker.Floorer); ok {
		return f.RaiseFloor(ctx, floor)
	}
	return nil
}

func (s *switchStore) CheckFloor(ctx context.Context) (bool, error) {
	if s.off.Load() {
		return false, errStoreGone
	}
	if f, ok := s.s.(tracker.Floorer); ok {
		return f.CheckFloor(ctx)
	}
	return true, nil
}

// pingStore is a switchStore whose inner store answers Ping.
type pingStore struct{ *switchStore }

func (s pingStore) Ping(ctx context.Context) error {
	s.gets.Add(1) // a probe, not an operation
	if s.off.Load() {
		return errStoreGone
	}
	return s.s.(tracker.Pinger).Ping(ctx)
}

// outageFixture is a tracker over a switchStore (over a memstore unless
// given), a memDurable, a recorder and a fake clock, with Run running.
type outageFixture struct {
	*fixture
	sw *switchStore
}

func newOutageFixture(t *testing.T, d *memDurable, cfg tracker.Config) *outageFixture {
	t.Helper()
	sw := &switchStore{s: memstore.New(memstore.Config{Rules: rules})}
	f := &fixture{t: t, ctx: context.Background(), clock: clock.NewFake(start), durable: d, pub: &recorder{}}
	cfg.Store, cfg.Durable, cfg.Publisher, cfg.Clock = sw, d, f.pub, f.clock
	cfg.Rules = rules
	if cfg.ProbeInterval == 0 {
		cfg.ProbeInterval = 5 * time.Millisecond
	}
	if cfg.SweepInterval == 0 {
		cfg.SweepInterval = time.Hour // the tests sweep themselves
	}
	tr, err := tracker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.tr = tr
	runTracker(t, tr)
	return &outageFixture{fixture: f, sw: sw}
}

// runTracker runs tr.Run until the end of the test.
func runTracker(t *testing.T, tr *tracker.Tracker) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func (f *fixture) waitUp() {
	f.t.Helper()
	testwait.For(f.t, "the store to be up again", func() bool { return !f.tr.Stats().Down })
}

func (f *fixture) bye(user, device string) {
	f.t.Helper()
	if _, err := f.tr.Bye(f.ctx, user, device); err != nil {
		f.t.Fatalf("Bye(%q, %q): %v", user, device, err)
	}
}

// read is a Get through the tracker (degraded while the store is down).
func (f *fixture) read(ids ...string) []presence.Snapshot {
	f.t.Helper()
	out := make([]presence.Snapshot, len(ids))
	if err := f.tr.Get(f.ctx, f.tr.Now(), ids, out); err != nil {
		f.t.Fatalf("tracker Get(%v): %v", ids, err)
	}
	return out
}

// debug returns the store's state of user.
func (f *fixture) debug(user string) presence.User {
	f.t.Helper()
	u, _, ok, err := f.tr.Debug(f.ctx, user)
	if err != nil || !ok {
		f.t.Fatalf("Debug(%q): ok=%v err=%v", user, ok, err)
	}
	return u
}

func lastBeat(u presence.User, device string) int64 {
	for _, d := range u.Devices {
		if d.ID == device {
			return d.LastBeat
		}
	}
	return -1
}

// TestOutageBuffersAndReplays: while the store is down, operations are
// buffered without touching it, reads answer from the durable store and
// the buffer, and when it is back the buffer is replayed with the true
// times; sweeps wait for the grace.
func TestOutageBuffersAndReplays(t *testing.T) {
	hidden := presence.Settings{Status: presence.Nobody, LastSeen: presence.Nobody}
	d := newMemDurable(
		presence.Profile{UserID: "c", LastSeen: ms(-time.Hour), PubLastSeen: ms(-time.Hour), Version: 7},
		presence.Profile{UserID: "h", LastSeen: ms(-time.Hour), PubLastSeen: ms(-time.Hour), Settings: hidden},
		presence.Profile{UserID: "inv", Manual: presence.ManualInvisible, LastSeen: ms(-time.Hour), PubLastSeen: ms(-2 * time.Hour)},
	)
	f := newOutageFixture(t, d, tracker.Config{})
	f.beat("a", "d1", true)
	f.beat("b", "d1", true)
	f.wantEvents("before", "a offline→online seen=0s", "b offline→online seen=0s")

	f.sw.off.Store(true)
	f.at(time.Second)
	f.beat("a", "d1", true) // detects the outage, and is buffered
	if s := f.tr.Stats(); !s.Down || s.Outages != 1 {
		t.Fatalf("after a failed beat: Down=%v Outages=%d, want true, 1", s.Down, s.Outages)
	}
	calls := f.sw.calls.Load()
	for i := 2; i <= 10; i++ {
		f.at(time.Duration(i) * time.Second)
		if ch := f.beat("a", "d1", true); ch.Changed {
			t.Errorf("a buffered beat returned a change")
		}
		f.beat("h", "p", true)
		f.beat("inv", "p", true)
		if i == 3 {
			f.beat("b", "d1", false) // b's last beat
		}
	}
	f.beat("a", "gone", true)
	f.bye("a", "gone")
	if n := f.sweep(); n != 0 {
		t.Errorf("a sweep while down applied %d changes", n)
	}
	if err := f.tr.Checkpoint(f.ctx); err != nil {
		t.Errorf("Checkpoint while the store is down: %v", err)
	}
	got := f.read("a", "b", "c", "h", "inv", "nobody", "a")
	if f.sw.calls.Load() != calls {
		t.Errorf("the store was called %d times while down, want 0", f.sw.calls.Load()-calls)
	}
	if s := f.tr.Stats(); s.Buffered != 4 || s.DegradedReads != 1 {
		t.Errorf("Stats while down: Buffered=%d DegradedReads=%d, want 4, 1", s.Buffered, s.DegradedReads)
	}
	f.wantEvents("while down")
	for _, c := range []struct {
		i                  int
		status             presence.Status
		seen, pubSeen      int64
		devices            int
		settings           presence.Settings
		known              bool
		version            uint64
		ignoreVersionCheck bool
	}{
		{0, presence.Online, ms(10 * time.Second), ms(10 * time.Second), 1, presence.Settings{}, true, 0, true},
		{1, presence.Away, ms(3 * time.Second), ms(3 * time.Second), 1, presence.Settings{}, true, 0, true}, // its activity before the outage is not known here
		{2, presence.Offline, ms(-time.Hour), ms(-time.Hour), 0, presence.Settings{}, true, 7, false},
		{3, presence.Online, ms(10 * time.Second), ms(10 * time.Second), 1, hidden, true, 0, false},
		{4, presence.Invisible, ms(10 * time.Second), ms(-2 * time.Hour), 1, presence.Settings{}, true, 0, false},
		{5, presence.Offline, 0, 0, 0, presence.Settings{}, false, 0, false},
		{6, presence.Online, ms(10 * time.Second), ms(10 * time.Second), 1, presence.Settings{}, true, 0, true},
	} {
		s := got[c.i]
		if s.Known != c.known || s.Status != c.status || s.LastSeen != c.seen || s.PubLastSeen != c.pubSeen ||
			s.Devices != c.devices || s.Settings != c.settings || (!c.ignoreVersionCheck && s.Version != c.version) {
			t.Errorf("degraded read of %q: got %+v, want known=%v status=%v seen=%v pub=%v devices=%d settings=%+v",
				s.UserID, s, c.known, c.status, offset(c.seen), offset(c.pubSeen), c.devices, c.settings)
		}
	}
	settings, err := f.tr.Settings(f.ctx, "h")
	if err != nil || settings != hidden {
		t.Errorf("Settings(h) while down = %+v, %v; want %+v", settings, err, hidden)
	}

	// Another node wrote a later beat of b's device meanwhile: the replay
	// must not move it back.
	if _, err := f.sw.s.Beat(f.ctx, ms(4*time.Second), "b", "d1", false); err != nil {
		t.Fatal(err)
	}
	for i := 15; i <= 40; i += 5 {
		f.at(time.Duration(i) * time.Second)
		f.beat("a", "d1", true)
		f.beat("h", "p", true)
		f.beat("inv", "p", true)
	}
	f.sw.off.Store(false)
	f.waitUp()
	if s := f.tr.Stats(); s.Buffered != 0 || s.Replayed != 4 || s.Down {
		t.Errorf("Stats after the replay: Buffered=%d Replayed=%d Down=%v, want 0, 4, false", s.Buffered, s.Replayed, s.Down)
	}
	f.wantEvents("replay", "h offline→online seen=40s")
	a := f.debug("a")
	if a.LastSeen != ms(40*time.Second) || lastBeat(a, "d1") != ms(40*time.Second) || lastBeat(a, "gone") != -1 {
		t.Errorf("a after the replay: %+v; want last_seen and d1's beat at 40s, no device gone", a)
	}
	if b := f.debug("b"); lastBeat(b, "d1") != ms(4*time.Second) {
		t.Errorf("b's device after the replay beat at %v, want 4s (the later beat stays)", offset(lastBeat(b, "d1")))
	}

	// b's device died at 34s, during the outage; the grace keeps sweeps
	// off until 42s. Then b goes offline once, at its last beat.
	f.at(41 * time.Second)
	if n := f.sweep(); n != 0 {
		t.Errorf("a sweep within the grace applied %d changes", n)
	}
	f.wantEvents("within the grace")
	f.at(43 * time.Second)
	f.beat("a", "d1", true)
	f.sweep()
	f.sweep()
	f.wantEvents("after the grace", "b online→offline seen=4s")
}

// TestOutageBufferFull: beyond MaxBuffered users, operations fail with
// ErrUnavailable; users already buffered still take theirs.
func TestOutageBufferFull(t *testing.T) {
	var recovered atomic.Int32
	f := newOutageFixture(t, newMemDurable(), tracker.Config{MaxBuffered: 2, OnRecover: func() { recovered.Add(1) }})
	f.sw.off.Store(true)
	f.beat("u1", "d", true)
	f.beat("u2", "d", true)
	if _, err := f.tr.Heartbeat(f.ctx, "u3", "d", true); !errors.Is(err, tracker.ErrUnavailable) {
		t.Errorf("a beat of a third user: %v, want ErrUnavailable", err)
	}
	if _, err := f.tr.Bye(f.ctx, "u3", "d"); !errors.Is(err, tracker.ErrUnavailable) {
		t.Errorf("a bye of a third user: %v, want ErrUnavailable", err)
	}
	if err := f.tr.SetSettings(f.ctx, "u3", presence.Settings{}); !errors.Is(err, tracker.ErrUnavailable) {
		t.Errorf("settings of a third user: %v, want ErrUnavailable", err)
	}
	if _, _, _, err := f.tr.Debug(f.ctx, "u1"); !errors.Is(err, tracker.ErrUnavailable) {
		t.Errorf("Debug while the store is down: %v, want ErrUnavailable", err)
	}
	f.beat("u1", "d2", true)
	f.status("u2", presence.ManualBusy, "meeting")
	f.sw.off.Store(false)
	f.waitUp()
	f.wantEvents("replay", "u1 offline→online seen=0s", `u2 offline→busy seen=0s text="meeting"`)
	if n := recovered.Load(); n != 1 {
		t.Errorf("OnRecover called %d times, want 1", n)
	}
	if u := f.debug("u1"); len(u.Devices) != 2 {
		t.Errorf("u1 has %d devices after the replay, want 2", len(u.Devices))
	}
}

// TestOutageReplayOrder: per device the order of beats and byes is kept,
// and operations that arrive during the replay go behind the buffered
// ones of the same user.
func TestOutageReplayOrder(t *testing.T) {
	f := newOutageFixture(t, newMemDurable(), tracker.Config{})
	f.beat("u", "keep", true)
	f.pub.take()
	f.sw.off.Store(true)
	f.at(time.Second)
	f.beat("u", "byeLast", true)
	f.beat("u", "byeFirst", true)
	f.beat("u", "late", true)
	f.at(2 * time.Second)
	f.bye("u", "byeFirst")
	f.bye("u", "byeLast")
	f.at(3 * time.Second)
	f.beat("u", "byeFirst", true)

	// While the replay applies u's first beat, a bye of "late" and a beat
	// of "keep" arrive: they must be applied after the buffered ones.
	var once atomic.Bool
	var hookErr error
	f.sw.setBeforeBeat(func(now int64, user, device string) {
		if once.CompareAndSwap(false, true) {
			f.clock.Set(start.Add(5 * time.Second))
			_, err1 := f.tr.Bye(f.ctx, "u", "late")
			_, err2 := f.tr.Heartbeat(f.ctx, "u", "keep", false)
			hookErr = errors.Join(err1, err2)
		}
	})
	f.sw.off.Store(false)
	f.waitUp()
	if hookErr != nil {
		t.Fatalf("operations during the replay: %v", hookErr)
	}
	u := f.debug("u")
	want := map[string]int64{"keep": ms(5 * time.Second), "byeFirst": ms(3 * time.Second)}
	if len(u.Devices) != len(want) {
		t.Errorf("devices after the replay: %+v, want %v", u.Devices, want)
	}
	for dev, at := range want {
		if got := lastBeat(u, dev); got != at {
			t.Errorf("device %s beat at %v, want %v", dev, offset(got), offset(at))
		}
	}
	if u.LastSeen != ms(5*time.Second) {
		t.Errorf("last_seen %v, want 5s", offset(u.LastSeen))
	}
}

// TestOutageKeptBeatingIsNeverOffline: users who kept beating through an
// outage longer than the ttl, and set a status or ended another device
// during it, are never announced offline; the replay publishes only the
// last change of each user, and only if it is still true.
func TestOutageKeptBeatingIsNeverOffline(t *testing.T) {
	f := newOutageFixture(t, newMemDurable(), tracker.Config{})
	f.beat("status", "phone", true)
	f.beat("bye", "phone", true)
	f.beat("bye", "tab", true)
	f.beat("gone", "phone", true)
	f.status("gone", presence.ManualNone, "")
	f.pub.take()
	f.sw.off.Store(true)
	// 60 s of outage (ttl 30 s), beats every 10 s.
	for s := 10; s <= 60; s += 10 {
		f.at(time.Duration(s) * time.Second)
		f.beat("status", "phone", true)
		f.beat("bye", "phone", true)
		if s == 10 {
			f.beat("came", "phone", true) // came and went during the outage
			f.beat("bye", "tab", true)
		}
		if s == 30 {
			f.status("status", presence.ManualBusy, "in a meeting")
		}
		if s == 40 {
			f.bye("bye", "tab")
		}
	}
	f.at(61 * time.Second)
	f.sw.off.Store(false)
	f.waitUp()
	f.wantEvents("replay",
		`status online→busy seen=30s text="in a meeting"`)
	if s := f.tr.Stats(); s.StaleReplays != 1 {
		t.Errorf("stale replays %d, want 1 (came)", s.StaleReplays)
	}
	for user, want := range map[string]presence.Status{
		"status": presence.Busy, "bye": presence.Online, "came": presence.Offline, "gone": presence.Offline} {
		var snap [1]presence.Snapshot
		if err := f.tr.Get(f.ctx, f.tr.Now(), []string{user}, snap[:]); err != nil {
			t.Fatal(err)
		}
		if got := snap[0].Status; got != want {
			t.Errorf("%s reads %v after the replay, want %v", user, got, want)
		}
	}
	// The sweeps after the grace settle the users whose devices died.
	f.at(61*time.Second + 3*time.Second)
	f.sweep()
	f.wantEvents("sweep after the replay",
		"came online→offline seen=10s",
		"gone online→offline seen=0s")
}

// TestCheckpointWhileStoreDown: a checkpoint while the store is down
// does nothing; the changes made before the outage are written once after
// it, none lost, none counted twice.
func TestCheckpointWhileStoreDown(t *testing.T) {
	d := newMemDurable()
	f := newOutageFixture(t, d, tracker.Config{FlushInterval: time.Hour})
	for _, u := range []string{"u1", "u2", "u3"} {
		f.beat(u, "d", true)
	}
	f.sw.off.Store(true)
	if err := f.tr.Checkpoint(f.ctx); err == nil {
		t.Errorf("the checkpoint that meets the outage: nil error, want one")
	}
	if err := f.tr.Checkpoint(f.ctx); err != nil {
		t.Errorf("a checkpoint while down: %v", err)
	}
	f.at(time.Second)
	f.beat("u1", "d", true)
	f.sw.off.Store(false)
	f.waitUp()
	if err := f.tr.Checkpoint(f.ctx); err != nil {
		t.Fatal(err)
	}
	if s := f.tr.Stats(); s.Flushed != 3 {
		t.Errorf("Flushed = %d, want 3", s.Flushed)
	}
	for u, want := range map[string]int64{"u1": ms(time.Second), "u2": ms(0), "u3": ms(0)} {
		if p, _ := d.profile(u); p.LastSeen != want {
			t.Errorf("durable last_seen of %s = %v, want %v", u, offset(p.LastSeen), offset(want))
		}
	}
}

// TestOutageDuringSetStatus: the state store goes away while a status is
// being set, around its durable write. A status that became durable is
// buffered and replayed; one that did not leaves the user as they were,
// also when its undo has to wait for the store.
func TestOutageDuringSetStatus(t *testing.T) {
	t.Run("durable", func(t *testing.T) {
		d := newMemDurable()
		f := newOutageFixture(t, d, tracker.Config{})
		f.beat("u", "d", true)
		f.wantEvents("beat", "u offline→online seen=0s")
		f.sw.offAtStatus.Store(true)
		if ch := f.status("u", presence.ManualBusy, "x"); ch.Changed {
			t.Errorf("SetStatus as the store went away: got a change, want it buffered")
		}
		if s := f.tr.Stats(); !s.Down || s.Buffered != 1 {
			t.Errorf("Stats: Down=%v Buffered=%d, want true, 1", s.Down, s.Buffered)
		}
		if p, _ := d.profile("u"); p.Manual != presence.ManualBusy {
			t.Errorf("durable manual status %v, want busy", p.Manual)
		}
		f.sw.off.Store(false)
		f.waitUp()
		f.wantEvents("replayed", `u online→busy seen=0s text="x"`)
		if s := f.read("u")[0]; s.Manual != presence.ManualBusy || s.Text != "x" {
			t.Errorf("after the replay: manual %v text %q, want busy %q", s.Manual, s.Text, "x")
		}
	})
	t.Run("not durable", func(t *testing.T) {
		d := newMemDurable()
		f := newOutageFixture(t, d, tracker.Config{})
		f.beat("u", "d", true)
		f.wantEvents("beat", "u offline→online seen=0s")
		d.setFail("SaveStatus", errDown)
		f.sw.offAtStatus.Store(true)
		if _, err := f.tr.SetStatus(f.ctx, "u", presence.ManualBusy, "x"); !errors.Is(err, errDown) {
			t.Fatalf("SetStatus: got %v, want %v", err, errDown)
		}
		if s := f.tr.Stats(); !s.Down || s.Buffered != 0 {
			t.Errorf("Stats: Down=%v Buffered=%d, want true, 0", s.Down, s.Buffered)
		}
		f.sw.off.Store(false)
		f.waitUp()
		f.wantEvents("nothing")
		if s := f.read("u")[0]; s.Manual != presence.ManualNone || s.Status != presence.Online {
			t.Errorf("after the outage: %v, manual %v; want online, none", s.Status, s.Manual)
		}
	})
	t.Run("undo buffered", func(t *testing.T) {
		d := newMemDurable()
		f := newOutageFixture(t, d, tracker.Config{})
		f.beat("u", "d", true)
		f.wantEvents("beat", "u offline→online seen=0s")
		// The change is applied and published; then the store goes away
		// and the durable write fails.
		d.beforeSaveStatus = func(string, presence.Manual) {
			deadline := time.Now().Add(15 * time.Second)
			for f.pub.count() == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			f.sw.off.Store(true)
		}
		d.setFail("SaveStatus", errDown)
		if _, err := f.tr.SetStatus(f.ctx, "u", presence.ManualInvisible, ""); !errors.Is(err, errDown) {
			t.Fatalf("SetStatus: got %v, want %v", err, errDown)
		}
		f.wantEvents("the change", "u online→offline seen=0s")
		if s := f.tr.Stats(); !s.Down || s.Buffered != 1 {
			t.Errorf("Stats: Down=%v Buffered=%d, want true, 1 (the undo)", s.Down, s.Buffered)
		}
		f.sw.off.Store(false)
		f.waitUp()
		f.wantEvents("the undo, replayed", "u offline→online seen=0s")
		if s := f.read("u")[0]; s.Manual != presence.ManualNone || s.Status != presence.Online {
			t.Errorf("after the outage: %v, manual %v; want online, none", s.Status, s.Manual)
		}
	})
}

// TestOutageDurableErrorKeepsTheStoreUp: a failing durable store is not
// an outage of the state store.
func TestOutageDurableErrorKeepsTheStoreUp(t *testing.T) {
	d := newMemDurable()
	f := newOutageFixture(t, d, tracker.Config{})
	d.setFail("LoadProfiles", errDown)
	if _, err := f.tr.Heartbeat(f.ctx, "u", "d", true); !errors.Is(err, errDown) {
		t.Errorf("Heartbeat with the durable store down: %v, want %v", err, errDown)
	}
	if s := f.tr.Stats(); s.Down || s.Outages != 0 {
		t.Errorf("Down=%v Outages=%d after a durable failure, want false, 0", s.Down, s.Outages)
	}
	if _, err := f.tr.Heartbeat(f.ctx, "u", "d", true); err == nil {
		t.Errorf("still: nil error")
	}
}

// TestOutageConcurrentBeats: goroutines beat while the store goes down and
// comes back several times; no beat fails and none is lost: every device
// ends with a last beat no older than its last call.
func TestOutageConcurrentBeats(t *testing.T) {
	f := newOutageFixture(t, newMemDurable(), tracker.Config{ProbeInterval: time.Millisecond})
	const workers, users = 4, 20
	var stop atomic.Bool
	last := make([][users]int64, workers) // time read before each worker's last beat of a user
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				u := i % users
				last[w][u] = f.tr.Now()
				if _, err := f.tr.Heartbeat(f.ctx, fmt.Sprintf("w%d-u%d", w, u), "d", i%3 != 0); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for round := range 6 {
		for range 20 {
			f.clock.Advance(time.Millisecond)
			time.Sleep(time.Millisecond)
		}
		f.sw.off.Store(round%2 == 0)
	}
	f.sw.off.Store(false)
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Heartbeat: %v", err)
	}
	f.waitUp()
	s := f.tr.Stats()
	if s.Buffered != 0 {
		t.Errorf("%d users still buffered after the recovery", s.Buffered)
	}
	t.Logf("outages %d, users replayed %d", s.Outages, s.Replayed)
	for w := range workers {
		for u := range users {
			id := fmt.Sprintf("w%d-u%d", w, u)
			if got := lastBeat(f.debug(id), "d"); got < last[w][u] {
				t.Errorf("%s: last beat %v, want at least %v", id, offset(got), offset(last[w][u]))
			}
		}
	}
}

// TestOutageReplayWaitsForDurable: a replay that needs a profile while the
// durable store fails keeps the buffer and is tried again until it works.
func TestOutageReplayWaitsForDurable(t *testing.T) {
	d := newMemDurable(presence.Profile{UserID: "u", LastSeen: ms(-time.Hour), Manual: presence.ManualBusy})
	f := newOutageFixture(t, d, tracker.Config{})
	f.sw.off.Store(true)
	f.beat("u", "d", true) // u is not in the store: its replay loads it
	d.setFail("LoadProfiles", errDown)
	f.sw.off.Store(false)
	testwait.For(t, "a failed replay", func() bool { return d.calledTimes("LoadProfiles") >= 3 })
	if s := f.tr.Stats(); !s.Down || s.Buffered != 1 {
		t.Errorf("after failed replays: Down=%v Buffered=%d, want true, 1", s.Down, s.Buffered)
	}
	d.setFail("LoadProfiles", nil)
	f.waitUp()
	f.wantEvents("replay", "u offline→busy seen=0s")
}

// A client that cycles through new device ids (a beat, then a bye, each
// with a fresh id) while the store is down does not grow its user's
// buffered record without bound: the oldest byes make room. The devices
// it still has live are kept.
func TestOutageBufferPerUserIsBounded(t *testing.T) {
	f := newOutageFixture(t, newMemDurable(), tracker.Config{})
	f.sw.off.Store(true)
	f.at(time.Second)
	f.beat("u", "keep", true)
	for i := range 1000 {
		d := fmt.Sprint("d", i)
		f.beat("u", d, true)
		f.bye("u", d)
	}
	signs := f.tr.Signs(f.tr.Now(), []string{"u"}, nil)
	max := 3 * 2 * presence.DefaultMaxDevices // a beat, an active beat and a bye per record
	if len(signs) > max {
		t.Errorf("%d signs buffered for one user after 1,000 devices came and went; want at most %d", len(signs), max)
	}
	if s := f.read("u")[0]; s.Status != presence.Online || s.Devices != 1 {
		t.Errorf("u reads %v with %d devices; want online with the one it kept", s.Status, s.Devices)
	}
}

// TestOutageReplayInvisibleText: an invisible user changes their text
// during an outage. The replay tells the user's own sockets (a change
// only the user sees) and nobody else; others still read the text of
// when the user vanished.
func TestOutageReplayInvisibleText(t *testing.T) {
	f := newOutageFixture(t, newMemDurable(), tracker.Config{})
	f.beat("u", "phone", true)
	gone := f.status("u", presence.ManualInvisible, "lunch").Event
	f.pub.take()
	f.sw.off.Store(true)
	f.at(time.Second)
	f.status("u", presence.ManualInvisible, "gone fishing")
	f.sw.off.Store(false)
	f.waitUp()
	evs := f.pub.take()
	if len(evs) != 1 || !evs[0].SelfOnly || evs[0].SelfText != "gone fishing" || evs[0].Text != "lunch" || evs[0].Version <= gone.Version {
		t.Fatalf("replay published %+v, want %q for the user alone", evs, "gone fishing")
	}
	if v := privacy.Filter(privacy.Relation{}, &f.read("u")[0]); v.Text != "lunch" || v.Version != gone.Version {
		t.Errorf("another viewer reads %+v after the replay, want %q at version %d", v, "lunch", gone.Version)
	}
}

// TestDegradedReadKeepsTheFrozenFace: while the store is down, a read
// computed from the durable profile and the buffered operations shows
// everyone else an invisible user's frozen face — not a version its own
// buffered text change stamped, nor that text; once a buffered change
// makes the user visible, the profile's version, as before it.
func TestDegradedReadKeepsTheFrozenFace(t *testing.T) {
	d := newMemDurable(presence.Profile{UserID: "u", Manual: presence.ManualInvisible, Text: "gone fishing",
		LastSeen: ms(0), PubLastSeen: ms(0), Version: 12, PubText: "lunch", PubVersion: 10})
	f := newOutageFixture(t, d, tracker.Config{})
	f.sw.off.Store(true)
	f.at(time.Second)
	f.beat("u", "phone", true)
	f.status("u", presence.ManualInvisible, "nap")
	s := f.read("u")[0]
	if v := privacy.Filter(privacy.Relation{}, &s); v.Text != "lunch" || v.Version != 10 || v.Status != presence.Offline {
		t.Errorf("while down, invisible: others read %+v, want offline %q at version 10", v, "lunch")
	}
	if v := privacy.Filter(privacy.Relation{Self: true}, &s); v.Text != "nap" || v.Version != 12 {
		t.Errorf("while down, invisible: the user reads %q at %d, want %q at 12", v.Text, v.Version, "nap")
	}
	f.status("u", presence.ManualNone, "back")
	s = f.read("u")[0]
	if v := privacy.Filter(privacy.Relation{}, &s); v.Text != "back" || v.Version != 12 || v.Status != presence.Online {
		t.Errorf("while down, visible again: others read %+v, want online %q at version 12", v, "back")
	}
}

// TestDegradedReadHidesATextSetWhileInvisible: an invisible user sets a
// text while the store is down. The status is durable at once, and a
// read computed from the durable record and the buffer shows everyone
// else the face the record keeps — the text the user vanished with once
// a checkpoint carried it, the one before otherwise (the checkpoint
// brings the newer: presence.Profile.SaveStatus) — never the new text.
func TestDegradedReadHidesATextSetWhileInvisible(t *testing.T) {
	for _, tc := range []struct {
		name       string
		checkpoint bool
		want       string
	}{
		{"checkpointed", true, "lunch"},
		{"not checkpointed", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newOutageFixture(t, newMemDurable(), tracker.Config{FlushInterval: time.Hour})
			f.beat("u", "phone", true)
			f.status("u", presence.ManualInvisible, "lunch")
			if tc.checkpoint {
				if err := f.tr.Checkpoint(f.ctx); err != nil {
					t.Fatal(err)
				}
			}
			f.sw.off.Store(true)
			f.at(time.Second)
			f.beat("u", "phone", true) // (a degraded read knows the devices that beat since)
			f.status("u", presence.ManualInvisible, "at the clinic")
			s := f.read("u")[0]
			if v := privacy.Filter(privacy.Relation{}, &s); v.Status != presence.Offline || v.Text != tc.want {
				t.Errorf("while down: others read %s %q, want offline %q", v.Status, v.Text, tc.want)
			}
			if v := privacy.Filter(privacy.Relation{Self: true}, &s); v.Status != presence.Invisible || v.Text != "at the clinic" {
				t.Errorf("while down: the user reads %s %q, want invisible %q", v.Status, v.Text, "at the clinic")
			}
		})
	}
}

// TestDegradedReadFaceAboveVersion: a durable record whose public
// version is above its version (no store writes one) is read degraded by
// the one rule of loads (presence.Profile.Raise): its face stays the
// face, also when buffered operations are applied to it.
func TestDegradedReadFaceAboveVersion(t *testing.T) {
	d := newMemDurable(presence.Profile{UserID: "u", Manual: presence.ManualInvisible, Text: "secret",
		LastSeen: ms(0), PubLastSeen: ms(0), PubText: "lunch", PubVersion: 5})
	f := newOutageFixture(t, d, tracker.Config{})
	f.sw.off.Store(true)
	f.at(time.Second)
	for _, beat := range []bool{false, true} {
		if beat {
			f.beat("u", "phone", true)
		}
		s := f.read("u")[0]
		other, self := privacy.Filter(privacy.Relation{}, &s), privacy.Filter(privacy.Relation{Self: true}, &s)
		if other.Text != "lunch" || other.Version != 5 || self.Text != "secret" || self.Version < other.Version {
			t.Errorf("beat %v: others read %q at %d, the user %q at %d; want %q at 5, %q at 5 at least",
				beat, other.Text, other.Version, self.Text, self.Version, "lunch", "secret")
		}
	}
}
