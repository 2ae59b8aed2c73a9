package query_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
	"github.com/presenced/presenced/internal/query"
)

// durable is an in-memory stand-in for the durable store: profiles and
// contact lists, counting the queries the reader makes.
type durable struct {
	mu       sync.Mutex
	profiles map[string]presence.Profile
	contacts map[string][]string // owner → contacts
	loads    [][]string          // ids of each LoadProfiles call
	listed   [][]string          // owners of each ListedBy call
}

func (d *durable) LoadProfiles(_ context.Context, ids []string, fn func(*presence.Profile)) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.loads = append(d.loads, slices.Clone(ids))
	for _, id := range ids {
		if p, ok := d.profiles[id]; ok {
			fn(&p)
		}
	}
	return nil
}

func (d *durable) ListedBy(_ context.Context, viewer string, owners []string, fn func(string)) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.listed = append(d.listed, slices.Clone(owners))
	for _, o := range owners {
		if slices.Contains(d.contacts[o], viewer) {
			fn(o)
		}
	}
	return nil
}

func TestRead(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := clock.NewFake(t0)
	rules := presence.Rules{TTL: 30 * time.Second, IdleAfter: 5 * time.Minute}
	store := memstore.New(memstore.Config{Rules: rules})
	now := t0.UnixMilli()
	hidden := presence.Settings{Status: presence.Contacts, LastSeen: presence.Contacts}
	for _, p := range []presence.Profile{
		{UserID: "on"},
		{UserID: "secret", Settings: hidden},
	} {
		if err := store.Load(ctx, now, &p); err != nil {
			t.Fatal(err)
		}
		if _, err := store.Beat(ctx, now, p.UserID, "d", true); err != nil {
			t.Fatal(err)
		}
	}
	d := &durable{
		profiles: map[string]presence.Profile{
			"gone": {UserID: "gone", LastSeen: now - 3600_000, PubLastSeen: now - 3600_000, Text: "on leave"},
			// An older durable copy of a held user: read, never shown.
			"secret": {UserID: "secret", LastSeen: now - 7200_000, PubLastSeen: now - 7200_000, Text: "stale", Settings: hidden},
		},
		contacts: map[string][]string{"secret": {"friend"}},
	}
	r, err := query.New(query.Config{States: store, Profiles: d, Contacts: d, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"on", "secret", "gone", "never"}

	type want struct {
		status   string // "" = hidden
		lastSeen int64  // 0 = hidden or never
		text     string
	}
	tests := []struct {
		viewer string
		want   []want
		listed [][]string // contact queries expected
	}{
		{"", []want{{"online", now, ""}, {"", 0, ""}, {"offline", now - 3600_000, "on leave"}, {"offline", 0, ""}}, nil},
		{"friend", []want{{"online", now, ""}, {"online", now, ""}, {"offline", now - 3600_000, "on leave"}, {"offline", 0, ""}}, [][]string{{"secret"}}},
		{"stranger", []want{{"online", now, ""}, {"", 0, ""}, {"offline", now - 3600_000, "on leave"}, {"offline", 0, ""}}, [][]string{{"secret"}}},
		{"secret", []want{{"online", now, ""}, {"online", now, ""}, {"offline", now - 3600_000, "on leave"}, {"offline", 0, ""}}, nil},
	}
	for _, tc := range tests {
		d.loads, d.listed = nil, nil
		out := make([]privacy.View, len(ids))
		if err := r.Read(ctx, tc.viewer, ids, out); err != nil {
			t.Fatalf("Read as %q: %v", tc.viewer, err)
		}
		for i, v := range out {
			var got want
			if v.StatusVisible {
				got.status = v.Status.String()
				got.text = v.Text
			}
			if v.LastSeenVisible {
				got.lastSeen = v.LastSeen
			}
			if v.UserID != ids[i] || got != tc.want[i] {
				t.Errorf("viewer %q, %s: got %s %+v, want %+v", tc.viewer, ids[i], v.UserID, got, tc.want[i])
			}
		}
		// The users the memory store does not hold go to the durable
		// store, in one call, and with them the held user whose status
		// may be hidden (read and ignored: a hidden user online must take
		// as long as one offline); the user everyone sees online does not.
		// The contact relation is asked for only where a setting depends
		// on it, and never for the viewer itself.
		if want := [][]string{{"secret", "gone", "never"}}; !slices.EqualFunc(d.loads, want, slices.Equal) {
			t.Errorf("viewer %q: durable loads %v, want %v", tc.viewer, d.loads, want)
		}
		if !slices.EqualFunc(d.listed, tc.listed, slices.Equal) {
			t.Errorf("viewer %q: contact queries %v, want %v", tc.viewer, d.listed, tc.listed)
		}
	}

	if err := r.Read(ctx, "", make([]string, query.MaxBatch+1), make([]privacy.View, query.MaxBatch+1)); err != query.ErrTooMany {
		t.Errorf("Read of %d ids: got %v, want ErrTooMany", query.MaxBatch+1, err)
	}
}

// A user read from the durable store because the hot state does not hold
// it carries its version plus ColdVersionMargin; users the hot state holds
// and users never seen keep theirs.
func TestColdVersionMargin(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rules := presence.Rules{TTL: 30 * time.Second, IdleAfter: 5 * time.Minute}
	store := memstore.New(memstore.Config{Rules: rules})
	now := t0.UnixMilli()
	hot := presence.Profile{UserID: "hot", Version: 7}
	if err := store.Load(ctx, now, &hot); err != nil {
		t.Fatal(err)
	}
	d := &durable{profiles: map[string]presence.Profile{"cold": {UserID: "cold", Version: 9, LastSeen: now - 1000, PubLastSeen: now - 1000}}}
	r, err := query.New(query.Config{States: store, Profiles: d, Contacts: d, Clock: clock.NewFake(t0), ColdVersionMargin: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"hot", "cold", "never"}
	out := make([]privacy.View, len(ids))
	if err := r.Read(ctx, "", ids, out); err != nil {
		t.Fatal(err)
	}
	for i, want := range []uint64{7, 9 + 1<<16, 0} {
		if out[i].Version != want {
			t.Errorf("%s: version %d, want %d", ids[i], out[i].Version, want)
		}
	}
}

// floorStates is a hot store that, like redisstore, gives users it does not
// hold the version floor its loads count on from.
type floorStates struct {
	query.States
	floor uint64
}

func (f floorStates) Get(ctx context.Context, now int64, ids []string, out []presence.Snapshot) error {
	if err := f.States.Get(ctx, now, ids, out); err != nil {
		return err
	}
	for i := range out {
		if !out[i].Known {
			out[i].Version = f.floor
		}
	}
	return nil
}

// A cold read is never below the hot store's floor: when the store lost
// its data, versions published from it may be above the durable one plus
// the margin, and the floor is above them all.
func TestColdVersionFloor(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rules := presence.Rules{TTL: 30 * time.Second, IdleAfter: 5 * time.Minute}
	const floor = 7 << 32
	d := &durable{profiles: map[string]presence.Profile{
		"below": {UserID: "below", Version: 5<<32 + 3},
		"above": {UserID: "above", Version: 8<<32 + 3},
	}}
	r, err := query.New(query.Config{States: floorStates{memstore.New(memstore.Config{Rules: rules}), floor},
		Profiles: d, Contacts: d, Clock: clock.NewFake(t0), ColdVersionMargin: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"below", "above", "never"}
	out := make([]privacy.View, len(ids))
	if err := r.Read(ctx, "", ids, out); err != nil {
		t.Fatal(err)
	}
	for i, want := range []uint64{floor, 8<<32 + 3 + 1<<16, floor} {
		if out[i].Version != want {
			t.Errorf("%s: version %d, want %d", ids[i], out[i].Version, uint64(want))
		}
	}
}

// A cold read of an invisible user whose text changed since they vanished
// shows everyone else the text they vanished with, at the public version
// moved by the margin (or the floor) as the version is: its distance
// below stays.
func TestColdFaceKeepsItsDistance(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rules := presence.Rules{TTL: 30 * time.Second, IdleAfter: 5 * time.Minute}
	const floor = 7 << 32
	face := presence.Profile{Manual: presence.ManualInvisible, Text: "gone fishing", PubText: "lunch", LastSeen: 9, PubLastSeen: 5}
	below, above := face, face
	below.UserID, below.Version, below.PubVersion = "below", 5<<32+3, 5<<32+1
	above.UserID, above.Version, above.PubVersion = "above", 8<<32+3, 8<<32+1
	d := &durable{profiles: map[string]presence.Profile{"below": below, "above": above}}
	r, err := query.New(query.Config{States: floorStates{memstore.New(memstore.Config{Rules: rules}), floor},
		Profiles: d, Contacts: d, Clock: clock.NewFake(t0), ColdVersionMargin: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		viewer, text string
		want         []uint64
	}{
		{"", "lunch", []uint64{floor - 2, 8<<32 + 1 + 1<<16}},
		{"below", "gone fishing", []uint64{floor, 8<<32 + 3 + 1<<16}}, // the user themselves: their own (below's)
	} {
		ids := []string{"below", "above"}
		out := make([]privacy.View, len(ids))
		if err := r.Read(ctx, tc.viewer, ids, out); err != nil {
			t.Fatal(err)
		}
		if tc.viewer == "" {
			for i := range ids {
				if out[i].Text != tc.text || out[i].Version != tc.want[i] {
					t.Errorf("%s read by everyone: %q at %d, want %q at %d", ids[i], out[i].Text, out[i].Version, tc.text, tc.want[i])
				}
			}
			continue
		}
		if out[0].Text != tc.text || out[0].Version != tc.want[0] {
			t.Errorf("below read by itself: %q at %d, want %q at %d", out[0].Text, out[0].Version, tc.text, tc.want[0])
		}
	}
}

// A cold read of a durable record whose public version is above its
// version (no store writes one; a record damaged or written by hand)
// counts the public version as the version: nobody reads a public version
// above what the user reads, whatever the margin and the floor.
func TestColdFaceAboveTheVersion(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rules := presence.Rules{TTL: 30 * time.Second, IdleAfter: 5 * time.Minute}
	const floor = 7 << 32
	face := presence.Profile{Manual: presence.ManualInvisible, Text: "gone fishing", PubText: "lunch", LastSeen: 9, PubLastSeen: 5}
	below, above := face, face
	below.UserID, below.Version, below.PubVersion = "below", 5<<32+1, 5<<32+3
	above.UserID, above.Version, above.PubVersion = "above", 8<<32+1, 8<<32+3
	d := &durable{profiles: map[string]presence.Profile{"below": below, "above": above}}
	r, err := query.New(query.Config{States: floorStates{memstore.New(memstore.Config{Rules: rules}), floor},
		Profiles: d, Contacts: d, Clock: clock.NewFake(t0), ColdVersionMargin: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"below", "above"}
	want := []uint64{floor, 8<<32 + 3 + 1<<16}
	for _, viewer := range ids {
		out := make([]privacy.View, len(ids))
		if err := r.Read(ctx, viewer, ids, out); err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			if text := map[bool]string{true: "gone fishing", false: "lunch"}[id == viewer]; out[i].Text != text || out[i].Version != want[i] {
				t.Errorf("%s read by %s: %q at %d, want %q at %d", id, viewer, out[i].Text, out[i].Version, text, want[i])
			}
		}
	}
}

// States reads users as they are, hidden settings and all, from the hot
// store (never the replica, which may lag), and the users it does not
// hold from the durable store with their versions raised as Read raises
// them.
func TestStates(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rules := presence.Rules{TTL: 30 * time.Second, IdleAfter: 5 * time.Minute}
	store, replica := memstore.New(memstore.Config{Rules: rules}), memstore.New(memstore.Config{Rules: rules})
	now := t0.UnixMilli()
	hidden := presence.Settings{Status: presence.Nobody, LastSeen: presence.Nobody}
	hot := presence.Profile{UserID: "hot", Version: 7, Settings: hidden, Manual: presence.ManualBusy}
	if err := store.Load(ctx, now, &hot); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Beat(ctx, now, "hot", "d", true); err != nil {
		t.Fatal(err)
	}
	stale := presence.Profile{UserID: "hot", Version: 3}
	if err := replica.Load(ctx, now, &stale); err != nil {
		t.Fatal(err)
	}
	d := &durable{profiles: map[string]presence.Profile{"cold": {UserID: "cold", Version: 9, LastSeen: now - 1000, PubLastSeen: now - 1000}}}
	r, err := query.New(query.Config{States: store, Statuses: replica, Profiles: d, Contacts: d, Clock: clock.NewFake(t0), ColdVersionMargin: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"hot", "cold", "never"}
	out := make([]presence.Snapshot, len(ids))
	if err := r.States(ctx, ids, out); err != nil {
		t.Fatal(err)
	}
	if s := out[0]; s.UserID != "hot" || !s.Known || s.Status != presence.Busy || s.Settings != hidden || s.Version <= 7 {
		t.Errorf("hot: %+v, want busy, hidden, above version 7", s)
	}
	if s := out[1]; s.UserID != "cold" || !s.Known || s.Status != presence.Offline || s.Version != 9+1<<16 {
		t.Errorf("cold: %+v, want offline at version %d", s, 9+1<<16)
	}
	if s := out[2]; s.UserID != "never" || s.Known {
		t.Errorf("never: %+v, want unknown", s)
	}
	if err := r.States(ctx, ids, out[:2]); err == nil {
		t.Error("States with len(out) != len(ids): no error")
	}
}

// failing is a source of states that never answers (a replica not ready).
type failing struct{}

func (failing) Get(context.Context, int64, []string, []presence.Snapshot) error {
	return errors.New("not ready")
}

// ReadViews reads the Views source, but the viewer's own view, which is
// the store's; Read never reads it (a snapshot a watch continues); a
// Views source that fails is replaced by the store.
func TestReadViews(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rules := presence.Rules{TTL: 30 * time.Second, IdleAfter: 5 * time.Minute}
	store, views := memstore.New(memstore.Config{Rules: rules}), memstore.New(memstore.Config{Rules: rules})
	now := t0.UnixMilli()
	for _, m := range []*memstore.Store{store, views} {
		for _, id := range []string{"me", "other"} {
			if err := m.Load(ctx, now, &presence.Profile{UserID: id}); err != nil {
				t.Fatal(err)
			}
			if _, err := m.Beat(ctx, now, id, "d", true); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The store has the newest: both busy; the views source lags.
	for _, id := range []string{"me", "other"} {
		if _, err := store.SetStatus(ctx, now, id, presence.ManualBusy, ""); err != nil {
			t.Fatal(err)
		}
	}
	d := &durable{}
	ids := []string{"me", "other"}
	for _, tc := range []struct {
		name  string
		views query.States
		read  func(r *query.Reader, out []privacy.View) error
		other presence.Status
	}{
		{"ReadViews", views, func(r *query.Reader, out []privacy.View) error { return r.ReadViews(ctx, "me", ids, out) }, presence.Online},
		{"Read", views, func(r *query.Reader, out []privacy.View) error { return r.Read(ctx, "me", ids, out) }, presence.Busy},
		{"ReadViews, views failing", failing{}, func(r *query.Reader, out []privacy.View) error { return r.ReadViews(ctx, "me", ids, out) }, presence.Busy},
	} {
		r, err := query.New(query.Config{States: store, Views: tc.views, Profiles: d, Contacts: d, Clock: clock.NewFake(t0)})
		if err != nil {
			t.Fatal(err)
		}
		out := make([]privacy.View, len(ids))
		if err := tc.read(r, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Status != presence.Busy {
			t.Errorf("%s: the viewer's own view %v, want busy (the store's)", tc.name, out[0].Status)
		}
		if out[1].Status != tc.other {
			t.Errorf("%s: other %v, want %v", tc.name, out[1].Status, tc.other)
		}
	}
}
