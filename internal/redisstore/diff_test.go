package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/tracker"
)

// TestDifferential plays random histories of beats, statuses, byes,
// loads, settings, sweeps and checkpoints on memstore (the rules applied
// by presence.User in Go) and on redisstore (the same rules ported to Lua)
// side by side, and compares every change, every snapshot, every
// checkpoint and the hot state with its deadline after every step. Times
// move mostly forward, by anything from 0 to past the ttl, idle and
// eviction times, and sometimes a little backwards (clocks of several
// nodes are not in step).
func TestDifferential(t *testing.T) {
	c := client(t)
	seeds, steps := 40, 400
	if testing.Short() {
		seeds, steps = 8, 200
	}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 0x5eed))
			rules := presence.Rules{
				TTL:        time.Duration(3+r.IntN(8)) * time.Second,
				IdleAfter:  time.Duration(5+r.IntN(30)) * time.Second,
				MaxDevices: 1 + r.IntN(3),
				CloseGrace: time.Duration(1+r.IntN(6)) * time.Second,
				Epoch:      []uint64{0, 0, 1, 9}[r.IntN(4)],
			}
			evict := time.Duration(20+r.IntN(60)) * time.Second
			mem := memstore.New(memstore.Config{Rules: rules, Shards: 1 + r.IntN(4), EvictAfter: evict})
			red := newStore(t, c, redisstore.Config{Rules: rules, Shards: 1 + r.IntN(8), Buckets: 1 + r.IntN(2)*63, EvictAfter: evict})
			d := &differ{t: t, r: r, mem: mem, red: red, now: 1_700_000_000_000, floor: rules.Epoch << 32, rules: rules.WithDefaults()}
			for i := range steps {
				d.step(i)
				if t.Failed() {
					t.Logf("history:\n%s", strings.Join(d.log, "\n"))
					return
				}
			}
		})
	}
}

type differ struct {
	t        *testing.T
	r        *rand.Rand
	mem, red tracker.Store
	now      int64
	floor    uint64 // Epoch<<32
	rules    presence.Rules
	log      []string
}

var (
	diffUsers   = []string{"a", "b", "c", "d"}
	diffDevices = []string{"phone", "laptop", "tab:let"}
	diffTexts   = []string{"", "", "lunch", "in a meeting"}
)

func (d *differ) step(i int) {
	t, r, ctx := d.t, d.r, context.Background()
	t.Helper()
	// Time: mostly small steps, sometimes past the ttl, idle or eviction
	// times, sometimes the same millisecond, sometimes a little back. Most
	// steps are whole seconds, like the ttl and idle times, so moments
	// fall exactly on deadlines often.
	grid := int64(1000)
	if r.IntN(4) == 0 {
		grid = 1
	}
	switch k := r.IntN(20); {
	case k < 2:
	case k < 3:
		d.now -= grid * int64(r.IntN(3))
	case k < 15:
		d.now += grid * int64(r.IntN(5))
	case k < 19:
		d.now += grid * int64(r.IntN(40))
	default:
		d.now += grid * int64(r.IntN(200))
	}
	now := d.now
	user := diffUsers[r.IntN(len(diffUsers))]
	dev := diffDevices[r.IntN(len(diffDevices))]
	var what string
	switch k := r.IntN(100); {
	case k < 8:
		what = d.burst()
	case k < 40:
		active := r.IntN(4) != 0
		what = fmt.Sprintf("Beat(%d, %s, %s, %v)", now, user, dev, active)
		d.same(what, func(s tracker.Store) (presence.Change, error) { return s.Beat(ctx, now, user, dev, active) })
	case k < 55:
		m, text := presence.Manual(r.IntN(4)), diffTexts[r.IntN(len(diffTexts))]
		what = fmt.Sprintf("SetStatus(%d, %s, %v, %q)", now, user, m, text)
		d.same(what, func(s tracker.Store) (presence.Change, error) { return s.SetStatus(ctx, now, user, m, text) })
	case k < 60:
		what = fmt.Sprintf("Bye(%d, %s, %s)", now, user, dev)
		d.same(what, func(s tracker.Store) (presence.Change, error) { return s.Bye(ctx, now, user, dev) })
	case k < 65:
		// since: mostly about now (the closed connection beat last), some
		// times well before (another connection beat since).
		since := now - grid*int64(r.IntN(8))
		what = fmt.Sprintf("Disconnect(%d, %s, %s, %d)", now, user, dev, since)
		d.same(what, func(s tracker.Store) (presence.Change, error) { return s.Disconnect(ctx, now, user, dev, since) })
	case k < 73:
		p := presence.Profile{
			UserID:      user,
			Manual:      presence.Manual(r.IntN(4)),
			Text:        diffTexts[r.IntN(len(diffTexts))],
			LastSeen:    now - int64(r.IntN(100_000)),
			PubLastSeen: now - int64(r.IntN(200_000)),
			Version:     d.version(),
			Settings:    presence.Settings{Status: presence.Visibility(r.IntN(3)), LastSeen: presence.Visibility(r.IntN(3))},
		}
		if r.IntN(3) == 0 && p.Version > 2 {
			// A checkpoint of an invisible user whose text changed
			// since they vanished: its public face.
			p.PubText, p.PubVersion = diffTexts[r.IntN(len(diffTexts))], p.Version-uint64(r.IntN(3))
			if r.IntN(4) == 0 {
				p.PubVersion = p.Version + 1 + uint64(r.IntN(2)) // no store writes one: it counts as the version
			}
		}
		what = fmt.Sprintf("Load(%d, %+v)", now, p)
		d.same(what, func(s tracker.Store) (presence.Change, error) {
			q := p
			return presence.Change{}, s.Load(ctx, now, &q)
		})
	case k < 76:
		set := &presence.Settings{Status: presence.Visibility(r.IntN(3)), LastSeen: presence.Visibility(r.IntN(3))}
		if r.IntN(4) == 0 {
			set = nil // keep them: a contact list changed
		}
		what = fmt.Sprintf("SetSettings(%d, %s, %+v)", now, user, set)
		d.same(what, func(s tracker.Store) (presence.Change, error) {
			return s.SetSettings(ctx, now, user, set)
		})
	case k < 92:
		what = fmt.Sprintf("Expire(%d)", now)
		var got [2][]presence.Change
		for j, s := range []tracker.Store{d.mem, d.red} {
			out, err := s.Expire(ctx, now, 1000, nil)
			if err != nil {
				t.Fatalf("step %d %s: %v", i, what, err)
			}
			slices.SortFunc(out, func(a, b presence.Change) int { return strings.Compare(a.Event.UserID, b.Event.UserID) })
			got[j] = out
		}
		if !slices.EqualFunc(got[0], got[1], sameChange) {
			t.Errorf("step %d %s:\n memstore   %+v\n redisstore %+v", i, what, got[0], got[1])
		}
		what += fmt.Sprintf(" → %d changes", len(got[0]))
	default:
		what = "Dirty"
		var got [2][]presence.Profile
		for j, s := range []tracker.Store{d.mem, d.red} {
			out, err := s.Dirty(ctx, nil)
			if err != nil {
				t.Fatalf("step %d %s: %v", i, what, err)
			}
			slices.SortFunc(out, func(a, b presence.Profile) int { return strings.Compare(a.UserID, b.UserID) })
			for k := range out {
				out[k].Version = max(out[k].Version, d.floor)
				out[k].PubVersion = max(out[k].PubVersion, d.floor)
			}
			got[j] = out
		}
		if !slices.Equal(got[0], got[1]) {
			t.Errorf("step %d %s:\n memstore   %+v\n redisstore %+v", i, what, got[0], got[1])
		}
	}
	d.log = append(d.log, fmt.Sprintf("%3d %s", i, what))

	// Every user's snapshot, at this moment and a little later (unswept).
	ids := append(slices.Clone(diffUsers), "nobody")
	for _, at := range []int64{now, now + int64(r.IntN(60_000))} {
		var snaps [2][]presence.Snapshot
		for j, s := range []tracker.Store{d.mem, d.red} {
			snaps[j] = make([]presence.Snapshot, len(ids))
			if err := s.Get(ctx, at, ids, snaps[j]); err != nil {
				t.Fatalf("step %d Get: %v", i, err)
			}
			for k := range snaps[j] {
				snaps[j][k].Version = max(snaps[j][k].Version, d.floor)
				snaps[j][k].PubVersion = max(snaps[j][k].PubVersion, d.floor)
			}
		}
		if !slices.Equal(snaps[0], snaps[1]) {
			t.Errorf("step %d Get(%d) after %s:\n memstore   %+v\n redisstore %+v", i, at, what, snaps[0], snaps[1])
		}
	}
	// The hot state and the deadline of every user.
	for _, id := range diffUsers {
		var us [2]presence.User
		var dl [2]int64
		var ok [2]bool
		for j, s := range []tracker.Store{d.mem, d.red} {
			var err error
			us[j], dl[j], ok[j], err = s.Debug(ctx, id)
			if err != nil {
				t.Fatalf("step %d Debug(%s): %v", i, id, err)
			}
			slices.SortFunc(us[j].Devices, func(a, b presence.Device) int { return strings.Compare(a.ID, b.ID) })
			us[j].Version = max(us[j].Version, d.floor)
			us[j].PubVersion = max(us[j].PubVersion, d.floor)
		}
		if ok[0] != ok[1] || !d.sameDeadline(dl[0], dl[1], &us[1]) || us[0].Profile != us[1].Profile || us[0].Pub != us[1].Pub ||
			us[0].PubText != us[1].PubText || !slices.Equal(us[0].Devices, us[1].Devices) {
			t.Errorf("step %d Debug(%s) after %s:\n memstore   ok=%v deadline=%d %+v\n redisstore ok=%v deadline=%d %+v",
				i, id, what, ok[0], dl[0], us[0], ok[1], dl[1], us[1])
		}
	}
}

// sameDeadline reports whether redisstore's deadline red of u agrees with
// memstore's, mem: they are the same, or red is later but no later than
// u's next deadline (when it has one: a user with no device is due at its
// eviction, and when it is evicted is compared by Debug's ok). A deadline
// of either moves later only when it comes due, but a sweep of redisstore
// moves every user of a bucket that comes due to its next deadline
// (lua/expire.lua): one of its users coming due is another's re-arm.
func (d *differ) sameDeadline(mem, red int64, u *presence.User) bool {
	if mem == red {
		return true
	}
	if mem == 0 || red < mem {
		return false
	}
	next := u.Deadline(&d.rules, d.now)
	return len(u.Devices) == 0 || next == 0 || red <= next
}

// version returns a version to load: around the floor of this run's
// versions (Epoch<<32) or of the runs before and after.
func (d *differ) version() uint64 {
	v := int64(d.floor) + int64(d.r.IntN(5)) - 2 + int64(d.r.IntN(3)-1)<<32
	if v < 0 {
		v = int64(d.r.IntN(10))
	}
	return uint64(v)
}

// Versions are compared as max(version, floor): redisstore loads a user
// at its shard's floor at least (the floor survives nothing but Redis's
// data; see the package doc), memstore at the durable version, and reads
// of a user not held carry the floor. The events of both are the same:
// the first event of a run is above the floor in both.

// same applies op to both stores and compares the outcomes. An operation
// on a user who is not held (never loaded, or evicted) loads an empty
// profile in both, as the tracker would.
func (d *differ) same(what string, op func(tracker.Store) (presence.Change, error)) {
	d.t.Helper()
	var chs [2]presence.Change
	var errs [2]error
	for j, s := range []tracker.Store{d.mem, d.red} {
		chs[j], errs[j] = op(s)
	}
	for _, want := range []error{tracker.ErrNotLoaded, presence.ErrTooManyDevices} {
		if errors.Is(errs[0], want) != errors.Is(errs[1], want) {
			d.t.Errorf("%s: memstore err %v, redisstore err %v", what, errs[0], errs[1])
		}
	}
	for j, err := range errs {
		if err != nil && !errors.Is(err, tracker.ErrNotLoaded) && !errors.Is(err, presence.ErrTooManyDevices) {
			d.t.Fatalf("%s: store %d: %v", what, j, err)
		}
	}
	if !sameChange(chs[0], chs[1]) {
		d.t.Errorf("%s:\n memstore   %+v\n redisstore %+v", what, chs[0], chs[1])
	}
}

// sameChange compares two changes of users in no room (the operations
// of this test join none).
func sameChange(a, b presence.Change) bool {
	return a.Changed == b.Changed && a.Event == b.Event && len(a.Rooms) == 0 && len(b.Rooms) == 0
}

// burst sends 2–12 heartbeats of random users and devices, at now or a
// few milliseconds later, to redisstore in one script call (as beats that
// queue behind a call in flight go) and to memstore one by one, and
// compares every outcome. Beats of one user, beats that take the fast
// path after one that did not, and beats of users not held mix in one
// call.
func (d *differ) burst() string {
	d.t.Helper()
	r, ctx := d.r, context.Background()
	beats := make([]redisstore.BeatArgs, 2+r.IntN(11))
	for i := range beats {
		if r.IntN(3) == 0 {
			d.now += int64(r.IntN(3))
		}
		beats[i] = redisstore.BeatArgs{User: diffUsers[r.IntN(len(diffUsers))], Device: diffDevices[r.IntN(len(diffDevices))],
			Now: d.now, Active: r.IntN(4) != 0}
	}
	what := fmt.Sprintf("BeatBatch(%+v)", beats)
	chs, errs := d.red.(*redisstore.Store).BeatBatch(ctx, beats)
	for i, b := range beats {
		ch, err := d.mem.Beat(ctx, b.Now, b.User, b.Device, b.Active)
		if errors.Is(err, tracker.ErrNotLoaded) != errors.Is(errs[i], tracker.ErrNotLoaded) ||
			errors.Is(err, presence.ErrTooManyDevices) != errors.Is(errs[i], presence.ErrTooManyDevices) {
			d.t.Errorf("%s: beat %d: memstore err %v, redisstore err %v", what, i, err, errs[i])
		}
		if errs[i] != nil && !errors.Is(errs[i], tracker.ErrNotLoaded) && !errors.Is(errs[i], presence.ErrTooManyDevices) {
			d.t.Fatalf("%s: beat %d: %v", what, i, errs[i])
		}
		if !sameChange(ch, chs[i]) {
			d.t.Errorf("%s: beat %d:\n memstore   %+v\n redisstore %+v", what, i, ch, chs[i])
		}
	}
	return what
}
