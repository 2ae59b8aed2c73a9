package tracker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
	"github.com/presenced/presenced/internal/tracker"
)

// start is the fake clock's start; every test plays time from here.
var start = time.UnixMilli(1_700_000_000_000)

var (
	errDown = errors.New("durable store is down")
	rules   = presence.Rules{TTL: 30 * time.Second, IdleAfter: 5 * time.Minute}
)

// memDurable is a real in-memory tracker.Durable. Any method can be told to
// fail. It is safe for concurrent use.
type memDurable struct {
	mu       sync.Mutex // guards the fields below
	profiles map[string]presence.Profile
	batches  [][]presence.Profile // every SaveLastSeen batch that was written
	fail     map[string]error     // method name → error it returns
	calls    map[string]int       // method name → calls, failed ones included

	// beforeSaveStatus, if set, runs at the start of SaveStatus.
	beforeSaveStatus func(user string, m presence.Manual)
	// beforeSaveLastSeen, if set, runs at the start of SaveLastSeen.
	beforeSaveLastSeen func()
}

var _ tracker.Durable = (*memDurable)(nil)

func newMemDurable(profiles ...presence.Profile) *memDurable {
	d := &memDurable{
		profiles: map[string]presence.Profile{},
		fail:     map[string]error{},
		calls:    map[string]int{},
	}
	for _, p := range profiles {
		d.profiles[p.UserID] = p
	}
	return d
}

// call counts a call of method and returns the error it is told to fail with.
func (d *memDurable) call(method string) error {
	d.calls[method]++
	return d.fail[method]
}

func (d *memDurable) setFail(method string, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.fail[method] = err
}

func (d *memDurable) calledTimes(method string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[method]
}

func (d *memDurable) profile(user string) (presence.Profile, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	p, ok := d.profiles[user]
	return p, ok
}

func (d *memDurable) written() [][]presence.Profile {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.batches)
}

func (d *memDurable) LoadProfiles(_ context.Context, ids []string, fn func(*presence.Profile)) error {
	d.mu.Lock()
	if err := d.call("LoadProfiles"); err != nil {
		d.mu.Unlock()
		return err
	}
	var found []presence.Profile
	for _, id := range ids {
		if p, ok := d.profiles[id]; ok {
			found = append(found, p)
		}
	}
	d.mu.Unlock()
	for i := range found {
		fn(&found[i])
	}
	return nil
}

func (d *memDurable) SaveStatus(_ context.Context, user string, m presence.Manual, text string) error {
	if d.beforeSaveStatus != nil {
		d.beforeSaveStatus(user, m)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.call("SaveStatus"); err != nil {
		return err
	}
	p := d.profiles[user]
	p.UserID = user
	p.SaveStatus(m, text) // the face with the status, as the SQL stores write it
	d.profiles[user] = p
	return nil
}

func (d *memDurable) SaveSettings(_ context.Context, user string, s presence.Settings) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.call("SaveSettings"); err != nil {
		return err
	}
	p := d.profiles[user]
	p.UserID, p.Settings = user, s
	d.profiles[user] = p
	return nil
}

// SaveLastSeen writes the batch all or nothing as the SQL stores do
// (presence.Profile.Checkpoint): never moving a value back.
func (d *memDurable) SaveLastSeen(_ context.Context, batch []presence.Profile) error {
	if d.beforeSaveLastSeen != nil {
		d.beforeSaveLastSeen()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.call("SaveLastSeen"); err != nil {
		return err
	}
	d.batches = append(d.batches, slices.Clone(batch))
	for _, b := range batch {
		p := d.profiles[b.UserID]
		p.UserID = b.UserID
		p.Checkpoint(&b)
		d.profiles[b.UserID] = p
	}
	return nil
}

// recorder is a Publisher that keeps copies of the events it is given.
type recorder struct {
	mu     sync.Mutex // guards events
	events []presence.Event
}

func (r *recorder) Publish(ev *presence.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, *ev)
}

// count returns how many events wait to be taken.
func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

// take returns the events published since the previous call.
func (r *recorder) take() []presence.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	evs := r.events
	r.events = nil
	return evs
}

// fixture is a tracker over a memstore, a memDurable, a recorder and a fake
// clock.
type fixture struct {
	t       *testing.T
	ctx     context.Context
	clock   *clock.Fake
	store   *memstore.Store
	durable *memDurable
	pub     *recorder
	tr      *tracker.Tracker
}

func newFixture(t *testing.T, d *memDurable) *fixture {
	t.Helper()
	return newFixtureWith(t, d, clock.NewFake(start), tracker.Config{})
}

// newFixtureWith builds a fixture; cfg's Store, Durable, Publisher and
// Clock are filled in.
func newFixtureWith(t *testing.T, d *memDurable, c *clock.Fake, cfg tracker.Config) *fixture {
	t.Helper()
	return newFixtureRules(t, d, c, cfg, rules)
}

// newFixtureRules is newFixtureWith with the store's rules (a run's epoch,
// a device cap).
func newFixtureRules(t *testing.T, d *memDurable, c *clock.Fake, cfg tracker.Config, r presence.Rules) *fixture {
	t.Helper()
	f := &fixture{
		t:       t,
		ctx:     context.Background(),
		clock:   c,
		store:   memstore.New(memstore.Config{Rules: r}),
		durable: d,
		pub:     &recorder{},
	}
	cfg.Store, cfg.Durable, cfg.Publisher, cfg.Clock = f.store, d, f.pub, c
	tr, err := tracker.New(cfg)
	if err != nil {
		t.Fatalf("tracker.New: %v", err)
	}
	f.tr = tr
	return f
}

// at sets the clock to start+d.
func (f *fixture) at(d time.Duration) { f.clock.Set(start.Add(d)) }

func (f *fixture) beat(user, device string, active bool) presence.Change {
	f.t.Helper()
	ch, err := f.tr.Heartbeat(f.ctx, user, device, active)
	if err != nil {
		f.t.Fatalf("Heartbeat(%q, %q): %v", user, device, err)
	}
	return ch
}

func (f *fixture) status(user string, m presence.Manual, text string) presence.Change {
	f.t.Helper()
	ch, err := f.tr.SetStatus(f.ctx, user, m, text)
	if err != nil {
		f.t.Fatalf("SetStatus(%q, %v, %q): %v", user, m, text, err)
	}
	return ch
}

func (f *fixture) sweep() int {
	f.t.Helper()
	n, err := f.tr.Sweep(f.ctx)
	if err != nil {
		f.t.Fatalf("Sweep: %v", err)
	}
	return n
}

func (f *fixture) get(user string) presence.Snapshot {
	f.t.Helper()
	var s [1]presence.Snapshot
	if err := f.store.Get(f.ctx, f.tr.Now(), []string{user}, s[:]); err != nil {
		f.t.Fatalf("Get(%q): %v", user, err)
	}
	return s[0]
}

// wantEvents checks the events published since the last check, ignoring
// their order across users.
func (f *fixture) wantEvents(what string, want ...string) {
	f.t.Helper()
	got := fmtEvents(f.pub.take())
	slices.Sort(got)
	want = slices.Clone(want)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		f.t.Errorf("%s: published\n\t%s\nwant\n\t%s", what, strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}

// fmtEvents formats events as "user prev→status seen=<offset>[ text=...]"
// with times as offsets from start.
func fmtEvents(evs []presence.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = fmt.Sprintf("%s %v→%v seen=%v", e.UserID, e.Prev, e.Status, offset(e.LastSeen))
		if e.Text != "" {
			out[i] += fmt.Sprintf(" text=%q", e.Text)
		}
	}
	return out
}

func offset(ms int64) time.Duration { return time.Duration(ms-start.UnixMilli()) * time.Millisecond }

func ms(d time.Duration) int64 { return start.Add(d).UnixMilli() }

func TestNewRequiresStoreAndDurable(t *testing.T) {
	if _, err := tracker.New(tracker.Config{Durable: newMemDurable()}); err == nil {
		t.Error("New without a Store: got no error")
	}
	if _, err := tracker.New(tracker.Config{Store: memstore.New(memstore.Config{})}); err == nil {
		t.Error("New without a Durable: got no error")
	}
}

func TestHeartbeatLoadsDurableProfile(t *testing.T) {
	past := ms(-48 * time.Hour)
	tests := []struct {
		name       string
		profile    *presence.Profile // nil: no durable record
		wantEvents []string
		wantStatus presence.Status
		wantPub    int64 // PubLastSeen after the beat
	}{
		{
			name:       "no record",
			wantEvents: []string{"u offline→online seen=0s"},
			wantStatus: presence.Online,
			wantPub:    ms(0),
		},
		{
			name:       "plain",
			profile:    &presence.Profile{UserID: "u", LastSeen: past, PubLastSeen: past, Version: 5},
			wantEvents: []string{"u offline→online seen=0s"},
			wantStatus: presence.Online,
			wantPub:    ms(0),
		},
		{
			name:       "busy with text",
			profile:    &presence.Profile{UserID: "u", Manual: presence.ManualBusy, Text: "on a call", LastSeen: past, PubLastSeen: past, Version: 5},
			wantEvents: []string{`u offline→busy seen=0s text="on a call"`},
			wantStatus: presence.Busy,
			wantPub:    ms(0),
		},
		{
			// The user went invisible before the restart: the first beat
			// after it must not announce them.
			name:       "invisible",
			profile:    &presence.Profile{UserID: "u", Manual: presence.ManualInvisible, LastSeen: past, PubLastSeen: past - 1000, Version: 5},
			wantStatus: presence.Invisible,
			wantPub:    past - 1000,
		},
		{
			name:       "invisible with text",
			profile:    &presence.Profile{UserID: "u", Manual: presence.ManualInvisible, Text: "shh", LastSeen: past, PubLastSeen: past, Version: 5},
			wantStatus: presence.Invisible,
			wantPub:    past,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newMemDurable()
			if tt.profile != nil {
				d = newMemDurable(*tt.profile)
			}
			f := newFixture(t, d)
			ch := f.beat("u", "d", true)
			f.wantEvents("first heartbeat", tt.wantEvents...)
			if ch.Changed != (len(tt.wantEvents) > 0) {
				t.Errorf("Heartbeat: got Changed=%v, want %v", ch.Changed, len(tt.wantEvents) > 0)
			}
			s := f.get("u")
			if s.Status != tt.wantStatus || s.PubLastSeen != tt.wantPub || s.LastSeen != ms(0) {
				t.Errorf("Get: got status %v last_seen %v pub %v, want %v %v %v",
					s.Status, offset(s.LastSeen), offset(s.PubLastSeen), tt.wantStatus, offset(ms(0)), offset(tt.wantPub))
			}
			if tt.profile != nil {
				if s.Manual != tt.profile.Manual || s.Text != tt.profile.Text {
					t.Errorf("Get: got manual %v text %q, want the durable %v %q", s.Manual, s.Text, tt.profile.Manual, tt.profile.Text)
				}
				if ch.Changed && ch.Event.Version <= tt.profile.Version {
					t.Errorf("event version %d is not above the durable %d", ch.Event.Version, tt.profile.Version)
				}
			}
			// Later heartbeats use the loaded state.
			f.at(time.Second)
			f.beat("u", "d", true)
			f.wantEvents("second heartbeat")
			if n := d.calledTimes("LoadProfiles"); n != 1 {
				t.Errorf("LoadProfiles: called %d times, want 1", n)
			}
		})
	}
}

func TestHeartbeatLoadFails(t *testing.T) {
	d := newMemDurable(presence.Profile{UserID: "u", Manual: presence.ManualInvisible})
	f := newFixture(t, d)
	d.setFail("LoadProfiles", errDown)
	ch, err := f.tr.Heartbeat(f.ctx, "u", "d", true)
	if !errors.Is(err, errDown) || ch.Changed {
		t.Fatalf("Heartbeat with the durable store down: got %+v, %v; want no change and %v", ch, err, errDown)
	}
	f.wantEvents("failed heartbeat")
	if s := f.get("u"); s.Known {
		t.Errorf("Get after failed load: got %+v, want unknown (an empty profile would forget the invisibility)", s)
	}
	d.setFail("LoadProfiles", nil)
	f.beat("u", "d", true)
	f.wantEvents("heartbeat after recovery")
	if s := f.get("u"); s.Status != presence.Invisible {
		t.Errorf("Get after recovery: got %v, want invisible", s.Status)
	}
}

// TestRestartKeepsInvisible plays a user who goes invisible on one tracker,
// then comes back to a new tracker (new memory, same durable store, the
// next epoch as the app takes it from the durable store at every start):
// after a clean shutdown and after a crash with no checkpoint at all.
func TestRestartKeepsInvisible(t *testing.T) {
	for _, clean := range []bool{true, false} {
		t.Run(map[bool]string{true: "clean", false: "crash"}[clean], func(t *testing.T) {
			d := newMemDurable()
			c := clock.NewFake(start)
			run1, run2 := rules, rules
			run1.Epoch, run2.Epoch = 1, 2
			f := newFixtureRules(t, d, c, tracker.Config{}, run1)
			f.beat("u", "d", true)
			f.at(10 * time.Second)
			f.beat("u", "d", true)
			f.at(12 * time.Second)
			f.status("u", presence.ManualInvisible, "")
			// Like a bye at 12s: last_seen frozen at the moment, not the last beat.
			f.wantEvents("before restart", "u offline→online seen=0s", "u online→offline seen=12s")
			f.at(15 * time.Second)
			f.beat("u", "d", true)
			last := f.get("u").Version
			if clean {
				if err := f.tr.Close(f.ctx); err != nil {
					t.Fatalf("Close: %v", err)
				}
			}

			c.Set(start.Add(20 * time.Second))
			g := newFixtureRules(t, d, c, tracker.Config{}, run2)
			g.beat("u", "d", true)
			g.wantEvents("first heartbeat after restart")
			s := g.get("u")
			wantPub := ms(12 * time.Second)
			if !clean {
				wantPub = 0 // never checkpointed
			}
			if s.Status != presence.Invisible || s.PubLastSeen != wantPub {
				t.Errorf("after restart: got status %v pub_last_seen %v, want invisible %v", s.Status, offset(s.PubLastSeen), offset(wantPub))
			}
			g.at(25 * time.Second)
			ch := g.status("u", presence.ManualNone, "")
			g.wantEvents("online after restart", "u offline→online seen=25s")
			if ch.Event.Version <= last {
				t.Errorf("version after restart: got %d, want above %d", ch.Event.Version, last)
			}
			if ch.Event.Version >= 1<<53 {
				t.Errorf("version after restart: got %d, want below 2^53", ch.Event.Version)
			}
		})
	}
}

// TestHeartbeatDeviceCap: a new device beyond Rules.MaxDevices alive ones
// is refused with ErrTooManyDevices and publishes nothing.
func TestHeartbeatDeviceCap(t *testing.T) {
	capped := rules
	capped.MaxDevices = 2
	f := newFixtureRules(t, newMemDurable(), clock.NewFake(start), tracker.Config{}, capped)
	f.beat("u", "d1", true)
	f.beat("u", "d2", true)
	f.wantEvents("two devices", "u offline→online seen=0s")
	f.at(time.Second)
	ch, err := f.tr.Heartbeat(f.ctx, "u", "d3", true)
	if !errors.Is(err, presence.ErrTooManyDevices) || ch.Changed {
		t.Fatalf("third device: got %+v, %v; want no change and ErrTooManyDevices", ch, err)
	}
	f.wantEvents("refused device")
	if s := f.get("u"); s.Devices != 2 || s.LastSeen != ms(0) {
		t.Errorf("Get: got %d devices last_seen %v, want 2 and 0s (the refused beat changed nothing)", s.Devices, offset(s.LastSeen))
	}
	f.beat("u", "d1", true)
	f.wantEvents("known device")
}

// TestEvictedUserKeepsPublishedVersions: a user the store evicted while its
// last checkpoint was not durable yet (the write failed, or was still in
// flight) must not be loaded back with an older version, or the tracker
// would stamp versions it already published and consumers would drop the
// new events as stale.
func TestEvictedUserKeepsPublishedVersions(t *testing.T) {
	const evictAfter = 10 * time.Minute // memstore's default
	// wantVersionsGrow checks the events of one user: online, offline at
	// 1s, online again at back, with growing versions.
	wantVersionsGrow := func(t *testing.T, f *fixture, back time.Duration) {
		t.Helper()
		evs := f.pub.take()
		want := []string{"u offline→online seen=0s", "u online→offline seen=1s", fmt.Sprintf("u offline→online seen=%v", back)}
		if got := fmtEvents(evs); !slices.Equal(got, want) {
			t.Fatalf("published %v, want %v", got, want)
		}
		for i := 1; i < len(evs); i++ {
			if evs[i].Version <= evs[i-1].Version {
				t.Errorf("event %d has version %d, not above the previous %d", i, evs[i].Version, evs[i-1].Version)
			}
		}
	}
	online := func(t *testing.T, f *fixture) {
		t.Helper()
		f.beat("u", "d", true)
		f.at(time.Second)
		if _, err := f.tr.Bye(f.ctx, "u", "d"); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("checkpoint failed", func(t *testing.T) {
		d := newMemDurable()
		f := newFixture(t, d)
		online(t, f)
		d.setFail("SaveLastSeen", errDown)
		if err := f.tr.Checkpoint(f.ctx); !errors.Is(err, errDown) {
			t.Fatalf("Checkpoint: got %v, want %v", err, errDown)
		}
		f.at(time.Second + evictAfter)
		f.sweep()
		if f.get("u").Known {
			t.Fatal("the user was not evicted; the test needs it to be")
		}
		f.at(12 * time.Minute)
		f.beat("u", "d", true)
		wantVersionsGrow(t, f, 12*time.Minute)

		// The write works again: the pending checkpoint moves nothing back.
		d.setFail("SaveLastSeen", nil)
		if err := f.tr.Checkpoint(f.ctx); err != nil {
			t.Fatal(err)
		}
		if p, _ := d.profile("u"); p.LastSeen != ms(12*time.Minute) || p.Version != f.get("u").Version {
			t.Errorf("durable: got last_seen %v version %d, want 12m0s and %d", offset(p.LastSeen), p.Version, f.get("u").Version)
		}
	})

	t.Run("checkpoint in flight", func(t *testing.T) {
		d := newMemDurable()
		f := newFixture(t, d)
		online(t, f)
		// While the checkpoint is being written, the user is evicted and
		// beats again. The beat may wait for the write; it must not read
		// the durable record the write is about to replace.
		back := time.Second + evictAfter
		done := make(chan struct{})
		d.beforeSaveLastSeen = func() {
			d.beforeSaveLastSeen = nil
			f.at(back)
			f.sweep()
			if f.get("u").Known {
				t.Error("the user was not evicted; the test needs it to be")
			}
			go func() {
				defer close(done)
				if _, err := f.tr.Heartbeat(f.ctx, "u", "d", true); err != nil {
					t.Errorf("Heartbeat: %v", err)
				}
			}()
			select { // give a beat that does not wait the time to load
			case <-done:
			case <-time.After(50 * time.Millisecond):
			}
		}
		if err := f.tr.Checkpoint(f.ctx); err != nil {
			t.Fatal(err)
		}
		<-done
		wantVersionsGrow(t, f, back)
	})
}

// TestSetStatusDurableBeforeAck: a status change is published while its
// durable write is still running, and SetStatus returns only after that
// write; a failed write undoes the change (published back), and the next
// changes are made one step at a time (durable, then applied) until a
// durable write succeeds again.
func TestSetStatusDurableBeforeAck(t *testing.T) {
	d := newMemDurable()
	f := newFixture(t, d)
	f.beat("u", "d", true)
	f.wantEvents("first beat", "u offline→online seen=0s")
	f.at(time.Second)

	// What the durable write saw of the rest of the call, checked after it
	// (the hook runs on the goroutine of the durable write).
	var (
		returned  atomic.Bool // SetStatus has returned
		published bool        // the change was published during the durable write
		hotBefore []presence.Manual
	)
	overlapped := func(string, presence.Manual) {
		deadline := time.Now().Add(15 * time.Second)
		for f.pub.count() == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		published = f.pub.count() > 0 && !returned.Load()
	}
	sequential := func(user string, _ presence.Manual) {
		hotBefore = append(hotBefore, f.get(user).Manual)
	}
	setStatus := func(m presence.Manual, text string) (presence.Change, error) {
		returned.Store(false)
		defer returned.Store(true)
		return f.tr.SetStatus(f.ctx, "u", m, text)
	}

	d.beforeSaveStatus = overlapped
	if _, err := setStatus(presence.ManualBusy, "x"); err != nil {
		t.Fatalf("SetStatus busy: %v", err)
	}
	if !published {
		t.Errorf("SetStatus busy: the change was not published while its durable write ran")
	}
	f.wantEvents("busy", `u online→busy seen=1s text="x"`)
	if p, _ := d.profile("u"); p.Manual != presence.ManualBusy || p.Text != "x" {
		t.Errorf("durable after SetStatus: got %v %q, want busy %q", p.Manual, p.Text, "x")
	}

	// The durable write fails: the change was seen, and is undone.
	d.setFail("SaveStatus", errDown)
	ch, err := setStatus(presence.ManualInvisible, "gone")
	if !errors.Is(err, errDown) || ch.Changed {
		t.Fatalf("SetStatus with the durable store down: got %+v, %v; want no change and %v", ch, err, errDown)
	}
	f.wantEvents("failed SetStatus: the change and its undo",
		`u busy→offline seen=1s text="gone"`, `u offline→busy seen=1s text="x"`)
	if s := f.get("u"); s.Status != presence.Busy || s.Manual != presence.ManualBusy || s.Text != "x" {
		t.Errorf("after a failed SetStatus: got %v, manual %v, text %q; want busy, busy, %q", s.Status, s.Manual, s.Text, "x")
	}
	if p, _ := d.profile("u"); p.Manual != presence.ManualBusy || p.Text != "x" {
		t.Errorf("durable after failed SetStatus: got %v %q, want busy %q", p.Manual, p.Text, "x")
	}

	// While it keeps failing, nothing is applied first: no flicker.
	d.beforeSaveStatus = sequential
	if _, err := setStatus(presence.ManualAway, ""); !errors.Is(err, errDown) {
		t.Fatalf("second SetStatus with the durable store down: got %v, want %v", err, errDown)
	}
	f.wantEvents("second failed SetStatus")

	// The first write after it is back is durable before it applies; the
	// next one overlaps again.
	d.setFail("SaveStatus", nil)
	f.status("u", presence.ManualInvisible, "gone")
	f.wantEvents("invisible", `u busy→offline seen=1s text="gone"`)
	if want := []presence.Manual{presence.ManualBusy, presence.ManualBusy}; !slices.Equal(hotBefore, want) {
		t.Errorf("hot manual status during the sequential durable writes: got %v, want %v (saved before applied)", hotBefore, want)
	}
	d.beforeSaveStatus = overlapped
	published = false
	if _, err := setStatus(presence.ManualNone, ""); err != nil {
		t.Fatalf("SetStatus online: %v", err)
	}
	if !published {
		t.Errorf("SetStatus after the durable store came back: the change was not published while its durable write ran")
	}
	f.wantEvents("online", `u offline→online seen=1s`)

	// The caller's own cancellation is no failure of the durable store.
	d.beforeSaveStatus = nil
	ctx, cancel := context.WithCancel(f.ctx)
	cancel()
	d.setFail("SaveStatus", context.Canceled)
	if _, err := f.tr.SetStatus(ctx, "u", presence.ManualBusy, ""); !errors.Is(err, context.Canceled) {
		t.Fatalf("SetStatus with a cancelled context: got %v, want %v", err, context.Canceled)
	}
	f.pub.take()
	d.setFail("SaveStatus", nil)
	d.beforeSaveStatus = overlapped
	published = false
	if _, err := setStatus(presence.ManualAway, ""); err != nil {
		t.Fatalf("SetStatus away: %v", err)
	}
	if !published {
		t.Errorf("SetStatus after a cancelled one: the change was not published while its durable write ran")
	}
}

func TestSetStatusUnknownUser(t *testing.T) {
	d := newMemDurable(presence.Profile{UserID: "u", Text: "old", LastSeen: ms(-time.Hour), PubLastSeen: ms(-time.Hour), Version: 9})
	f := newFixture(t, d)
	// Offline: saved and held, nothing published until a device beats.
	f.status("u", presence.ManualBusy, "old")
	f.wantEvents("busy while offline")
	if s := f.get("u"); !s.Known || s.Manual != presence.ManualBusy || s.LastSeen != ms(-time.Hour) {
		t.Errorf("Get: got %+v, want the durable profile with manual busy", s)
	}
	f.beat("u", "d", true)
	f.wantEvents("first beat", `u offline→busy seen=0s text="old"`)
}

func TestSetSettings(t *testing.T) {
	d := newMemDurable()
	f := newFixture(t, d)
	want := presence.Settings{Status: presence.Contacts, LastSeen: presence.Nobody}
	if err := f.tr.SetSettings(f.ctx, "u", want); err != nil {
		t.Fatalf("SetSettings: %v", err)
	}
	if got, err := f.tr.Settings(f.ctx, "u"); err != nil || got != want {
		t.Errorf("Settings: got %+v, %v; want %+v", got, err, want)
	}
	if p, _ := d.profile("u"); p.Settings != want {
		t.Errorf("durable settings: got %+v, want %+v", p.Settings, want)
	}
	d.setFail("SaveSettings", errDown)
	if err := f.tr.SetSettings(f.ctx, "u", presence.Settings{}); !errors.Is(err, errDown) {
		t.Errorf("SetSettings with the durable store down: got %v, want %v", err, errDown)
	}
	if got := f.get("u").Settings; got != want {
		t.Errorf("settings after failed SetSettings: got %+v, want %+v", got, want)
	}
	// The change that was made is published (so watchers who lost sight
	// are told), the one refused is not.
	evs := f.pub.take()
	if len(evs) != 1 || !evs[0].SettingsOnly || evs[0].Settings != want || evs[0].PrevSettings != (presence.Settings{}) || evs[0].Version == 0 {
		t.Errorf("settings: published %+v, want one settings-only event to %+v", evs, want)
	}
}

func TestSweepPublishesOffline(t *testing.T) {
	f := newFixtureWith(t, newMemDurable(), clock.NewFake(start), tracker.Config{SweepBatch: 2})
	for _, u := range []string{"a", "b", "c", "d", "e"} {
		f.beat(u, "phone", true)
	}
	f.at(10 * time.Second)
	f.beat("a", "phone", false)
	f.wantEvents("beats", "a offline→online seen=0s", "b offline→online seen=0s", "c offline→online seen=0s",
		"d offline→online seen=0s", "e offline→online seen=0s")

	f.at(30*time.Second - time.Millisecond)
	if n := f.sweep(); n != 0 {
		t.Errorf("Sweep at ttl-1ms: got %d changes, want 0", n)
	}
	f.wantEvents("Sweep at ttl-1ms")
	f.at(30 * time.Second)
	if n := f.sweep(); n != 4 {
		t.Errorf("Sweep at ttl: got %d changes, want 4 (more than one batch)", n)
	}
	f.wantEvents("Sweep at ttl", "b online→offline seen=0s", "c online→offline seen=0s",
		"d online→offline seen=0s", "e online→offline seen=0s")
	f.at(40*time.Second - time.Millisecond)
	f.sweep()
	f.wantEvents("Sweep before a's ttl")
	f.at(41 * time.Second) // a late sweep: last_seen is still the last beat
	if n := f.sweep(); n != 1 {
		t.Errorf("Sweep after a's ttl: got %d changes, want 1", n)
	}
	evs := f.pub.take()
	if got := fmtEvents(evs); !slices.Equal(got, []string{"a online→offline seen=10s"}) {
		t.Errorf("Sweep after a's ttl: published %v", got)
	} else if evs[0].At != ms(41*time.Second) {
		t.Errorf("offline event At: got %v, want 41s", offset(evs[0].At))
	}
	if n := f.sweep(); n != 0 {
		t.Errorf("second Sweep: got %d changes, want 0", n)
	}
}

func TestCheckpoint(t *testing.T) {
	d := newMemDurable()
	f := newFixture(t, d)
	for _, u := range []string{"a", "b", "c"} {
		f.beat(u, "d", true)
	}
	f.at(5 * time.Second)
	f.beat("a", "d", true)
	f.beat("a", "d2", false)
	f.tr.Bye(f.ctx, "c", "d")
	if err := f.tr.Checkpoint(f.ctx); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	batches := d.written()
	if len(batches) != 1 {
		t.Fatalf("Checkpoint: got %d batches, want 1", len(batches))
	}
	wantBatch(t, "first checkpoint", batches[0], map[string]int64{"a": ms(5 * time.Second), "b": ms(0), "c": ms(5 * time.Second)})
	if err := f.tr.Checkpoint(f.ctx); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if n := len(d.written()); n != 1 {
		t.Errorf("Checkpoint without changes: got %d batches in all, want still 1", n)
	}
	if n := d.calledTimes("SaveLastSeen"); n != 1 {
		t.Errorf("Checkpoint without changes: SaveLastSeen called %d times in all, want 1", n)
	}
	if got := f.tr.Stats().Flushed; got != 3 {
		t.Errorf("Stats.Flushed: got %d, want 3", got)
	}
}

func TestCheckpointRetriesFailedBatch(t *testing.T) {
	d := newMemDurable()
	f := newFixture(t, d)
	f.beat("a", "d", true)
	f.beat("b", "d", true)
	d.setFail("SaveLastSeen", errDown)
	if err := f.tr.Checkpoint(f.ctx); !errors.Is(err, errDown) {
		t.Fatalf("Checkpoint with the durable store down: got %v, want %v", err, errDown)
	}
	f.at(5 * time.Second)
	f.beat("a", "d", true)
	f.beat("c", "d", true)
	if err := f.tr.Checkpoint(f.ctx); !errors.Is(err, errDown) {
		t.Fatalf("second Checkpoint with the durable store down: got %v, want %v", err, errDown)
	}
	f.at(6 * time.Second)
	f.beat("a", "d", true)
	if n := len(d.written()); n != 0 {
		t.Fatalf("batches written while down: got %d, want 0", n)
	}

	d.setFail("SaveLastSeen", nil)
	if err := f.tr.Checkpoint(f.ctx); err != nil {
		t.Fatalf("Checkpoint after recovery: %v", err)
	}
	batches := d.written()
	if len(batches) != 1 {
		t.Fatalf("Checkpoint after recovery: got %d batches, want 1", len(batches))
	}
	want := map[string]int64{"a": ms(6 * time.Second), "b": ms(0), "c": ms(5 * time.Second)}
	wantBatch(t, "retried checkpoint", batches[0], want)
	for u, seen := range want {
		if p, ok := d.profile(u); !ok || p.LastSeen != seen {
			t.Errorf("durable %s: got last_seen %v (held %v), want %v", u, offset(p.LastSeen), ok, offset(seen))
		}
	}
	st := f.tr.Stats()
	if st.FlushErrors != 2 || st.Flushed != 3 {
		t.Errorf("Stats: got %d flush errors and %d flushed, want 2 and 3", st.FlushErrors, st.Flushed)
	}
	if err := f.tr.Checkpoint(f.ctx); err != nil || len(d.written()) != 1 {
		t.Errorf("Checkpoint after the retry: got %v with %d batches, want nothing new", err, len(d.written()))
	}
}

// TestCheckpointRetryKeepsTheFace: a checkpoint that failed is retried
// with a newer one of the same user, who went invisible in between with a
// text everyone was shown (their face): the merged checkpoint writes that
// face, kept as an invisible user's is (presence.Profile.Frozen), so the
// text they set next stays theirs alone in the durable record too.
func TestCheckpointRetryKeepsTheFace(t *testing.T) {
	d := newMemDurable()
	f := newFixture(t, d)
	f.beat("u", "d", true)
	d.setFail("SaveLastSeen", errDown)
	if err := f.tr.Checkpoint(f.ctx); !errors.Is(err, errDown) {
		t.Fatalf("Checkpoint with the durable store down: got %v, want %v", err, errDown)
	}
	f.at(time.Second)
	gone := f.status("u", presence.ManualInvisible, "lunch").Event
	d.setFail("SaveLastSeen", nil)
	if err := f.tr.Checkpoint(f.ctx); err != nil {
		t.Fatalf("Checkpoint after recovery: %v", err)
	}
	f.at(2 * time.Second)
	f.status("u", presence.ManualInvisible, "at the clinic")
	p, _ := d.profile("u")
	if text, v := p.Public(); text != "lunch" || v != gone.Version || p.Text != "at the clinic" {
		t.Errorf("durable record: public %q at %d, own %q; want %q at %d, %q", text, v, p.Text, "lunch", gone.Version, "at the clinic")
	}
}

// wantBatch checks that a checkpoint batch holds each user of want once,
// with the wanted last_seen and a non-zero version.
func wantBatch(t *testing.T, what string, batch []presence.Profile, want map[string]int64) {
	t.Helper()
	got := map[string]int64{}
	for _, p := range batch {
		if _, dup := got[p.UserID]; dup {
			t.Errorf("%s: %q appears more than once", what, p.UserID)
		}
		got[p.UserID] = p.LastSeen
		if p.Version == 0 || p.PubLastSeen == 0 {
			t.Errorf("%s: %q has version %d pub_last_seen %d, want both set", what, p.UserID, p.Version, p.PubLastSeen)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%s: got %d users %v, want %d %v", what, len(got), got, len(want), want)
	}
	for u, seen := range want {
		if got[u] != seen {
			t.Errorf("%s: %s last_seen got %v, want %v", what, u, offset(got[u]), offset(seen))
		}
	}
}

func TestCloseIsIdempotentAndCheckpoints(t *testing.T) {
	d := newMemDurable()
	f := newFixture(t, d)
	f.beat("u", "d", true)
	if err := f.tr.Close(f.ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if p, ok := d.profile("u"); !ok || p.LastSeen != ms(0) {
		t.Errorf("durable after Close: got %+v (held %v), want last_seen written", p, ok)
	}
	for range 2 {
		if err := f.tr.Close(f.ctx); err != nil {
			t.Errorf("second Close: %v", err)
		}
	}
	if n := d.calledTimes("SaveLastSeen"); n != 1 {
		t.Errorf("SaveLastSeen: called %d times over three Closes, want 1", n)
	}
}

func TestRunCheckpointsOnStop(t *testing.T) {
	d := newMemDurable()
	f := newFixture(t, d)
	f.beat("u", "d", true)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.tr.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if p, ok := d.profile("u"); !ok || p.LastSeen != ms(0) {
		t.Errorf("durable after Run stopped: got %+v (held %v), want last_seen written", p, ok)
	}
	if err := f.tr.Close(context.Background()); err != nil {
		t.Errorf("Close after Run: %v", err)
	}
}

func TestStats(t *testing.T) {
	f := newFixture(t, newMemDurable())
	f.beat("a", "d", true)
	f.beat("a", "d", true)
	f.beat("a", "d2", true)
	f.beat("b", "d", true)
	f.beat("c", "d", false)
	f.status("a", presence.ManualBusy, "")
	f.status("a", presence.ManualBusy, "text")
	f.status("b", presence.ManualInvisible, "")
	f.at(10 * time.Second)
	f.beat("c", "d", true) // away → online
	f.at(30 * time.Second)
	f.sweep() // a busy → offline; b invisible, no event

	st := f.tr.Stats()
	if st.Heartbeats != 6 {
		t.Errorf("Heartbeats: got %d, want 6", st.Heartbeats)
	}
	if st.TextChanges != 1 {
		t.Errorf("TextChanges: got %d, want 1", st.TextChanges)
	}
	if st.Online != 1 {
		t.Errorf("Online: got %d, want 1 (c)", st.Online)
	}
	want := map[[2]presence.Status]uint64{
		{presence.Offline, presence.Online}: 2,
		{presence.Offline, presence.Away}:   1,
		{presence.Online, presence.Busy}:    1,
		{presence.Online, presence.Offline}: 1,
		{presence.Away, presence.Online}:    1,
		{presence.Busy, presence.Offline}:   1,
	}
	if len(st.Transitions) != len(want) {
		t.Errorf("Transitions: got %v, want %v", st.Transitions, want)
	}
	for k, n := range want {
		if st.Transitions[k] != n {
			t.Errorf("Transitions[%v→%v]: got %d, want %d", k[0], k[1], st.Transitions[k], n)
		}
	}
}

// step is one step of a scenario: at a clock offset, an operation and the
// events it must publish.
type step struct {
	at     time.Duration
	op     string // beat, idle (inactive beat), status, bye, sweep
	user   string
	device string
	manual presence.Manual
	text   string
	want   []string // published events, see fmtEvents
}

func beat(at time.Duration, user, device string, want ...string) step {
	return step{at: at, op: "beat", user: user, device: device, want: want}
}

func idle(at time.Duration, user, device string, want ...string) step {
	return step{at: at, op: "idle", user: user, device: device, want: want}
}

func setStatus(at time.Duration, user string, m presence.Manual, text string, want ...string) step {
	return step{at: at, op: "status", user: user, manual: m, text: text, want: want}
}

func bye(at time.Duration, user, device string, want ...string) step {
	return step{at: at, op: "bye", user: user, device: device, want: want}
}

func sweep(at time.Duration, want ...string) step {
	return step{at: at, op: "sweep", want: want}
}

// every returns the steps of mk at from, from+each, ... while before to.
func every(from, each, to time.Duration, mk func(at time.Duration) []step) []step {
	var out []step
	for at := from; at < to; at += each {
		out = append(out, mk(at)...)
	}
	return out
}

// idleAndSweep is an inactive beat followed by a sweep, expecting nothing.
func idleAndSweep(user, device string) func(at time.Duration) []step {
	return func(at time.Duration) []step { return []step{idle(at, user, device), sweep(at)} }
}

func concat(parts ...any) []step {
	var out []step
	for _, p := range parts {
		switch p := p.(type) {
		case step:
			out = append(out, p)
		case []step:
			out = append(out, p...)
		default:
			panic(fmt.Sprintf("concat: %T", p))
		}
	}
	return out
}

const ms1 = time.Millisecond

func TestScenarios(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{"idle then active again", concat(
			beat(0, "u", "d", "u offline→online seen=0s"),
			every(20*time.Second, 20*time.Second, 5*time.Minute, idleAndSweep("u", "d")),
			sweep(5*time.Minute-ms1),
			sweep(5*time.Minute, "u online→away seen=4m40s"),
			sweep(5*time.Minute+ms1),
			beat(5*time.Minute+5*time.Second, "u", "d", "u away→online seen=5m5s"),
			sweep(5*time.Minute+35*time.Second-ms1),
			sweep(5*time.Minute+35*time.Second, "u online→offline seen=5m5s"),
		)},
		{"idle noticed by a heartbeat before any sweep", concat(
			beat(0, "u", "d", "u offline→online seen=0s"),
			every(25*time.Second, 25*time.Second, 5*time.Minute, func(at time.Duration) []step {
				return []step{idle(at, "u", "d")}
			}),
			idle(5*time.Minute, "u", "d", "u online→away seen=5m0s"),
			sweep(5*time.Minute),
		)},
		{"invisible while online and back", concat(
			beat(0, "u", "d", "u offline→online seen=0s"),
			beat(10*time.Second, "u", "d"),
			setStatus(15*time.Second, "u", presence.ManualInvisible, "", "u online→offline seen=15s"),
			beat(20*time.Second, "u", "d"),
			beat(40*time.Second, "u", "d"),
			sweep(45*time.Second),
			setStatus(50*time.Second, "u", presence.ManualNone, "", "u offline→online seen=50s"),
			bye(55*time.Second, "u", "d", "u online→offline seen=55s"),
			sweep(2*time.Minute),
		)},
		{"invisible user's devices die silently", concat(
			beat(0, "u", "d", "u offline→online seen=0s"),
			setStatus(time.Second, "u", presence.ManualInvisible, "", "u online→offline seen=1s"),
			beat(10*time.Second, "u", "d"),
			sweep(40*time.Second),
			beat(time.Hour, "u", "d"),
			setStatus(time.Hour+time.Second, "u", presence.ManualNone, "", "u offline→online seen=1h0m1s"),
		)},
		{"invisible reads like a bye at the same moment", concat(
			beat(0, "b", "d", "b offline→online seen=0s"),
			beat(0, "i", "d", "i offline→online seen=0s"),
			beat(10*time.Second, "b", "d"),
			beat(10*time.Second, "i", "d"),
			bye(15*time.Second, "b", "d", "b online→offline seen=15s"),
			setStatus(15*time.Second, "i", presence.ManualInvisible, "", "i online→offline seen=15s"),
			every(20*time.Second, 10*time.Second, 2*time.Minute, func(at time.Duration) []step {
				return []step{beat(at, "i", "d"), sweep(at)}
			}),
			sweep(3*time.Minute),
		)},
		{"invisible while the device is dead but unswept reads like an expiry", concat(
			beat(0, "u", "d", "u offline→online seen=0s"),
			beat(10*time.Second, "u", "d"),
			setStatus(45*time.Second, "u", presence.ManualInvisible, "", "u online→offline seen=10s"),
			sweep(46*time.Second),
		)},
		{"reconnect inside the ttl", concat(
			beat(0, "u", "d", "u offline→online seen=0s"),
			beat(10*time.Second, "u", "d"),
			// The connection drops; the client reconnects 1ms before the ttl.
			every(11*time.Second, time.Second, 40*time.Second-ms1, func(at time.Duration) []step {
				return []step{sweep(at)}
			}),
			beat(40*time.Second-ms1, "u", "d"),
			sweep(40*time.Second),
			sweep(70*time.Second-2*ms1),
			sweep(70*time.Second-ms1, "u online→offline seen=39.999s"),
		)},
		{"reconnect with a new device id", concat(
			beat(0, "u", "conn-1", "u offline→online seen=0s"),
			beat(25*time.Second, "u", "conn-2"),
			sweep(30*time.Second),
			sweep(55*time.Second-ms1),
			sweep(55*time.Second, "u online→offline seen=25s"),
		)},
		{"two devices", concat(
			beat(0, "u", "phone", "u offline→online seen=0s"),
			beat(5*time.Second, "u", "laptop"),
			beat(20*time.Second, "u", "phone"),
			sweep(35*time.Second), // the laptop dies, the phone lives
			beat(40*time.Second, "u", "phone"),
			bye(45*time.Second, "u", "laptop"),
			bye(46*time.Second, "u", "phone", "u online→offline seen=46s"),
			sweep(2*time.Minute),
		)},
		{"two devices die one after the other", concat(
			beat(0, "u", "phone", "u offline→online seen=0s"),
			beat(time.Second, "u", "laptop"),
			sweep(30*time.Second),
			sweep(31*time.Second-ms1),
			sweep(31*time.Second, "u online→offline seen=1s"),
		)},
		{"bye of one of two devices", concat(
			beat(0, "u", "phone", "u offline→online seen=0s"),
			beat(time.Second, "u", "laptop"),
			bye(2*time.Second, "u", "laptop"),
			sweep(30*time.Second, "u online→offline seen=2s"),
		)},
		{"busy ignores idle, online clears it", concat(
			beat(0, "u", "d", "u offline→online seen=0s"),
			setStatus(time.Second, "u", presence.ManualBusy, "", "u online→busy seen=1s"),
			every(20*time.Second, 20*time.Second, 6*time.Minute, idleAndSweep("u", "d")),
			sweep(6*time.Minute),
			setStatus(6*time.Minute, "u", presence.ManualNone, "", "u busy→away seen=6m0s"),
			beat(6*time.Minute+time.Second, "u", "d", "u away→online seen=6m1s"),
		)},
		{"status set while offline", concat(
			setStatus(0, "u", presence.ManualAway, ""),
			sweep(time.Minute),
			beat(2*time.Minute, "u", "d", "u offline→away seen=2m0s"),
			setStatus(2*time.Minute, "u", presence.ManualAway, "back soon", `u away→away seen=2m0s text="back soon"`),
		)},
		{"several users", concat(
			beat(0, "a", "d", "a offline→online seen=0s"),
			beat(0, "b", "d", "b offline→online seen=0s"),
			beat(20*time.Second, "a", "d"),
			sweep(30*time.Second, "b online→offline seen=0s"),
			sweep(50*time.Second, "a online→offline seen=20s"),
		)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, newMemDurable())
			for i, st := range tt.steps {
				f.at(st.at)
				what := fmt.Sprintf("step %d at %v: %s %s/%s", i, st.at, st.op, st.user, st.device)
				var err error
				switch st.op {
				case "beat", "idle":
					_, err = f.tr.Heartbeat(f.ctx, st.user, st.device, st.op == "beat")
				case "status":
					_, err = f.tr.SetStatus(f.ctx, st.user, st.manual, st.text)
				case "bye":
					_, err = f.tr.Bye(f.ctx, st.user, st.device)
				case "sweep":
					_, err = f.tr.Sweep(f.ctx)
				default:
					t.Fatalf("%s: unknown op", what)
				}
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				f.wantEvents(what, st.want...)
			}
		})
	}
}

// TestConcurrentUse runs heartbeats, status changes, sweeps and checkpoints
// at once (for the race detector) and checks that nothing is lost.
func TestConcurrentUse(t *testing.T) {
	d := newMemDurable()
	f := newFixtureWith(t, d, clock.NewFake(start), tracker.Config{SweepBatch: 3})
	const users, beats = 50, 20
	ctx, cancel := context.WithCancel(context.Background())
	var bg, wg sync.WaitGroup
	bg.Go(func() {
		for ctx.Err() == nil {
			if _, err := f.tr.Sweep(ctx); err != nil {
				t.Errorf("Sweep: %v", err)
			}
			if err := f.tr.Checkpoint(ctx); err != nil {
				t.Errorf("Checkpoint: %v", err)
			}
		}
	})
	for u := range users {
		wg.Go(func() {
			user := fmt.Sprint("u", u)
			for i := range beats {
				if _, err := f.tr.Heartbeat(ctx, user, fmt.Sprint("d", i%2), true); err != nil {
					t.Errorf("Heartbeat: %v", err)
				}
				if i == beats/2 && u%2 == 0 {
					if _, err := f.tr.SetStatus(ctx, user, presence.ManualBusy, ""); err != nil {
						t.Errorf("SetStatus: %v", err)
					}
				}
			}
		})
	}
	wg.Wait()
	cancel()
	bg.Wait()
	if err := f.tr.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if st := f.tr.Stats(); st.Online != users || st.Heartbeats != users*beats {
		t.Errorf("Stats: got %d online, %d heartbeats; want %d, %d", st.Online, st.Heartbeats, users, users*beats)
	}
	perUser := map[string][]presence.Event{}
	for _, e := range f.pub.take() {
		perUser[e.UserID] = append(perUser[e.UserID], e)
	}
	for u := range users {
		user := fmt.Sprint("u", u)
		want := 1
		if u%2 == 0 {
			want = 2
		}
		if n := len(perUser[user]); n != want {
			t.Errorf("%s: got %d events %v, want %d", user, n, fmtEvents(perUser[user]), want)
		}
		if p, ok := d.profile(user); !ok || p.LastSeen != ms(0) || p.Version == 0 {
			t.Errorf("%s: durable %+v (held %v), want last_seen and version checkpointed", user, p, ok)
		}
	}
}

// With a ReloadMargin, a user loaded from the durable store counts its
// versions on from above the margin: versions stamped after the last
// checkpoint, by a shared store that has since lost them, are not reused.
func TestReloadMargin(t *testing.T) {
	d := newMemDurable(presence.Profile{UserID: "u", Version: 5})
	f := newFixtureWith(t, d, clock.NewFake(start), tracker.Config{ReloadMargin: 1 << 16})
	ch, err := f.tr.Heartbeat(f.ctx, "u", "d", true)
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(5 + 1<<16 + 1); ch.Event.Version < want {
		t.Errorf("version after a reload: %d, want at least %d", ch.Event.Version, want)
	}
	// A user with no durable record starts from nothing, as before.
	ch, err = f.tr.Heartbeat(f.ctx, "new", "d", true)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Event.Version >= 1<<16 {
		t.Errorf("a new user's first version %d carries the margin", ch.Event.Version)
	}
}

// TestInvisibleFaceSurvivesReload: the public face of an invisible user
// who changed their text is checkpointed with the profile, and a store
// that loads the user again (a restart, Redis emptied, with its reload
// margin) shows everyone else the same face: the text of when the user
// vanished, at a version the margin moved with the user's own.
func TestInvisibleFaceSurvivesReload(t *testing.T) {
	d := newMemDurable()
	f := newFixture(t, d)
	f.beat("u", "phone", true)
	gone := f.status("u", presence.ManualInvisible, "lunch").Event
	own := f.status("u", presence.ManualInvisible, "gone fishing").Event
	if err := f.tr.Checkpoint(f.ctx); err != nil {
		t.Fatal(err)
	}
	const margin = 1 << 16
	g := newFixtureWith(t, d, f.clock, tracker.Config{ReloadMargin: margin})
	g.beat("u", "phone", true) // loads u
	s := g.get("u")
	if v := privacy.Filter(privacy.Relation{}, &s); v.Text != "lunch" || v.Version != gone.Version+margin {
		t.Errorf("after the reload another viewer reads %q at version %d, want %q at %d", v.Text, v.Version, "lunch", gone.Version+margin)
	}
	if v := privacy.Filter(privacy.Relation{Self: true}, &s); v.Text != "gone fishing" || v.Version != own.Version+margin {
		t.Errorf("after the reload the user reads %q at version %d, want %q at %d", v.Text, v.Version, "gone fishing", own.Version+margin)
	}
}

// TestFailedCheckpointKeepsTheNewestFace: a checkpoint that failed is
// written with the next one, each user once, with the public face that
// goes with the newest version.
func TestFailedCheckpointKeepsTheNewestFace(t *testing.T) {
	d := newMemDurable()
	f := newFixture(t, d)
	f.beat("u", "phone", true)
	f.status("u", presence.ManualNone, "here")
	d.setFail("SaveLastSeen", errors.New("disk full"))
	if err := f.tr.Checkpoint(f.ctx); err == nil {
		t.Fatal("checkpoint: no error")
	}
	gone := f.status("u", presence.ManualInvisible, "lunch").Event
	own := f.status("u", presence.ManualInvisible, "gone fishing").Event
	d.setFail("SaveLastSeen", nil)
	if err := f.tr.Checkpoint(f.ctx); err != nil {
		t.Fatal(err)
	}
	p, _ := d.profile("u")
	if text, v := p.Public(); text != "lunch" || v != gone.Version || p.Version != own.Version {
		t.Errorf("written: public %q v%d, version %d; want %q v%d, version %d", text, v, p.Version, "lunch", gone.Version, own.Version)
	}
}
