// Package storetest is the conformance suite of tracker.Store: the
// behaviour of the state model written once and run against every backend
// (memory, Redis, ...). It uses only the Store interface and drives time by
// the now values it passes, so it never sleeps.
//
// A backend's test calls Run with a factory that returns a fresh, empty and
// isolated store for each subtest (for a shared server: its own key prefix
// or database), using the given rules.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
	"github.com/presenced/presenced/internal/tracker"
)

// Factory returns a new empty store that applies rules.
type Factory func(t *testing.T, rules presence.Rules) tracker.Store

// DefaultRules are the rules of DESIGN.md: ttl 30s, idle after 5m.
var DefaultRules = presence.Rules{TTL: 30 * time.Second, IdleAfter: 5 * time.Minute}

// t0 is the start of every scenario, in Unix ms.
const t0 int64 = 1_700_000_000_000

const (
	sec    = int64(1000)
	minute = 60 * sec
)

// Run runs the conformance suite against the stores newStore returns.
//
// Scenarios span a few hours of store time: a store must keep a user it
// holds for at least a day of store time without change (configure any
// eviction of idle users beyond that), or Get would rightly say Known=false.
func Run(t *testing.T, newStore func(t *testing.T, rules presence.Rules) tracker.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, f Factory)
	}{
		{"NotLoaded", testNotLoaded},
		{"LoadInsertsIfAbsent", testLoadInsertsIfAbsent},
		{"FirstBeatOnline", testFirstBeatOnline},
		{"BeatWithoutChange", testBeatWithoutChange},
		{"TTLBoundary", testTTLBoundary},
		{"LateSweepLastSeen", testLateSweepLastSeen},
		{"IdleThenActive", testIdleThenActive},
		{"InactiveBeatsStayAway", testInactiveBeatsStayAway},
		{"TwoDevices", testTwoDevices},
		{"ConcurrentDevices", testConcurrentDevices},
		{"ReconnectInsideTTL", testReconnectInsideTTL},
		{"Bye", testBye},
		{"Disconnect", testDisconnect},
		{"ManualStatus", testManualStatus},
		{"ManualWhileOffline", testManualWhileOffline},
		{"ManualIgnoresIdle", testManualIgnoresIdle},
		{"TextChange", testTextChange},
		{"Invisible", testInvisible},
		{"InvisibleDevicesDie", testInvisibleDevicesDie},
		{"InvisibleWhileOffline", testInvisibleWhileOffline},
		{"InvisibleLikeBye", testInvisibleLikeBye},
		{"InvisibleText", testInvisibleText},
		{"InvisibleFromTheStart", testInvisibleFromTheStart},
		{"LoadFaceAboveVersion", testLoadFaceAboveVersion},
		{"VersionsIncrease", testVersionsIncrease},
		{"VersionsAboveEpoch", testVersionsAboveEpoch},
		{"VersionsIgnoreClock", testVersionsIgnoreClock},
		{"DeviceCap", testDeviceCap},
		{"DefaultDeviceCap", testDefaultDeviceCap},
		{"ExpireMax", testExpireMax},
		{"ExpireConcurrent", testExpireConcurrent},
		{"Get", testGet},
		{"GetMany", testGetMany},
		{"Dirty", testDirty},
		{"SetSettings", testSetSettings},
		{"Debug", testDebug},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, newStore) })
	}
}

// ev is the part of an event a test expects. Zero fields other than the
// statuses are not checked.
type ev struct {
	user     string
	prev     presence.Status
	status   presence.Status
	text     string
	lastSeen int64
	at       int64
}

func (e ev) String() string {
	return fmt.Sprintf("%s %v→%v text=%q last_seen=%d at=%d", e.user, e.prev, e.status, e.text, e.lastSeen, e.at)
}

// h is a store under test with helpers that fail the test on errors.
type h struct {
	t     *testing.T
	s     tracker.Store
	ctx   context.Context
	rules presence.Rules
}

func newH(t *testing.T, f Factory, rules presence.Rules) *h {
	t.Helper()
	s := f(t, rules)
	if s == nil {
		t.Fatal("factory returned a nil store")
	}
	return &h{t: t, s: s, ctx: context.Background(), rules: rules}
}

func (h *h) ttl() int64  { return h.rules.TTL.Milliseconds() }
func (h *h) idle() int64 { return h.rules.IdleAfter.Milliseconds() }

func (h *h) load(now int64, p presence.Profile) {
	h.t.Helper()
	if err := h.s.Load(h.ctx, now, &p); err != nil {
		h.t.Fatalf("Load(%q): %v", p.UserID, err)
	}
}

func (h *h) beat(now int64, user, device string, active bool) presence.Change {
	h.t.Helper()
	ch, err := h.s.Beat(h.ctx, now, user, device, active)
	if err != nil {
		h.t.Fatalf("Beat(%d, %q, %q, %v): %v", now, user, device, active, err)
	}
	return ch
}

// join loads user (empty profile) and beats device at now.
func (h *h) join(now int64, user, device string) presence.Change {
	h.t.Helper()
	h.load(now, presence.Profile{UserID: user})
	return h.beat(now, user, device, true)
}

func (h *h) status(now int64, user string, m presence.Manual, text string) presence.Change {
	h.t.Helper()
	ch, err := h.s.SetStatus(h.ctx, now, user, m, text)
	if err != nil {
		h.t.Fatalf("SetStatus(%d, %q, %v, %q): %v", now, user, m, text, err)
	}
	return ch
}

func (h *h) bye(now int64, user, device string) presence.Change {
	h.t.Helper()
	ch, err := h.s.Bye(h.ctx, now, user, device)
	if err != nil {
		h.t.Fatalf("Bye(%d, %q, %q): %v", now, user, device, err)
	}
	return ch
}

// expire applies every deadline due by now and returns the changes.
func (h *h) expire(now int64) []presence.Change {
	h.t.Helper()
	const batch = 1000
	var all []presence.Change
	for {
		out, err := h.s.Expire(h.ctx, now, batch, nil)
		if err != nil {
			h.t.Fatalf("Expire(%d): %v", now, err)
		}
		if len(out) > batch {
			h.t.Fatalf("Expire(%d, max=%d) returned %d changes", now, batch, len(out))
		}
		for i, ch := range out {
			if !ch.Changed && len(ch.Rooms) == 0 {
				h.t.Fatalf("Expire(%d) returned change %d with neither a change nor a room event: %+v", now, i, ch)
			}
		}
		all = append(all, out...)
		if len(out) < batch {
			return all
		}
	}
}

func (h *h) get(now int64, id string) presence.Snapshot {
	h.t.Helper()
	var out [1]presence.Snapshot
	if err := h.s.Get(h.ctx, now, []string{id}, out[:]); err != nil {
		h.t.Fatalf("Get(%d, %q): %v", now, id, err)
	}
	return out[0]
}

func (h *h) dirty() []presence.Profile {
	h.t.Helper()
	out, err := h.s.Dirty(h.ctx, nil)
	if err != nil {
		h.t.Fatalf("Dirty: %v", err)
	}
	return out
}

// wantNone fails if ch is a change.
func (h *h) wantNone(what string, ch presence.Change) {
	h.t.Helper()
	if ch.Changed {
		h.t.Errorf("%s: got event %s, want none", what, gotEv(ch.Event))
	}
}

// wantNoEvents fails if chs holds any change.
func (h *h) wantNoEvents(what string, chs []presence.Change) {
	h.t.Helper()
	for _, ch := range chs {
		h.t.Errorf("%s: got event %s, want none", what, gotEv(ch.Event))
	}
}

// wantEvent checks that ch is a change matching want and returns its event.
func (h *h) wantEvent(what string, ch presence.Change, want ev) presence.Event {
	h.t.Helper()
	if !ch.Changed {
		h.t.Errorf("%s: got no event, want %s", what, want)
		return ch.Event
	}
	e := ch.Event
	if e.UserID != want.user || e.Prev != want.prev || e.Status != want.status || e.Text != want.text ||
		(want.lastSeen != 0 && e.LastSeen != want.lastSeen) || (want.at != 0 && e.At != want.at) {
		h.t.Errorf("%s: got event %s, want %s", what, gotEv(e), want)
	}
	if e.Status == presence.Invisible || e.Prev == presence.Invisible {
		h.t.Errorf("%s: event %s shows invisible; events carry the public status", what, gotEv(e))
	}
	if e.Version == 0 {
		h.t.Errorf("%s: event %s has version 0", what, gotEv(e))
	}
	if e.Self.Public() != e.Status {
		h.t.Errorf("%s: event %s has the true status %v, whose public one is not the event's", what, gotEv(e), e.Self)
	}
	return e
}

// wantOne checks that chs is exactly one change matching want.
func (h *h) wantOne(what string, chs []presence.Change, want ev) presence.Event {
	h.t.Helper()
	if len(chs) != 1 {
		for _, ch := range chs {
			h.t.Logf("%s: got %s", what, gotEv(ch.Event))
		}
		h.t.Fatalf("%s: got %d events, want 1: %s", what, len(chs), want)
	}
	return h.wantEvent(what, chs[0], want)
}

// wantSnap checks the fields of a snapshot that a test cares about.
func (h *h) wantSnap(what string, got presence.Snapshot, status presence.Status, devices int, lastSeen, pubLastSeen int64) {
	h.t.Helper()
	if !got.Known || got.Status != status || got.Devices != devices || got.LastSeen != lastSeen || got.PubLastSeen != pubLastSeen {
		h.t.Errorf("%s: got known=%v status=%v devices=%d last_seen=%d pub_last_seen=%d, want known=true status=%v devices=%d last_seen=%d pub_last_seen=%d",
			what, got.Known, got.Status, got.Devices, got.LastSeen, got.PubLastSeen, status, devices, lastSeen, pubLastSeen)
	}
}

func gotEv(e presence.Event) string {
	return fmt.Sprintf("%s %v→%v text=%q last_seen=%d at=%d v=%d", e.UserID, e.Prev, e.Status, e.Text, e.LastSeen, e.At, e.Version)
}

func testNotLoaded(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	ops := []struct {
		name string
		do   func() (presence.Change, error)
	}{
		{"Beat", func() (presence.Change, error) { return h.s.Beat(h.ctx, t0, "u", "d", true) }},
		{"SetStatus", func() (presence.Change, error) {
			return h.s.SetStatus(h.ctx, t0, "u", presence.ManualBusy, "x")
		}},
		{"SetSettings", func() (presence.Change, error) {
			return h.s.SetSettings(h.ctx, t0, "u", &presence.Settings{Status: presence.Nobody})
		}},
	}
	for _, op := range ops {
		ch, err := op.do()
		if !errors.Is(err, tracker.ErrNotLoaded) {
			t.Errorf("%s before Load: got err %v, want ErrNotLoaded", op.name, err)
		}
		h.wantNone(op.name+" before Load", ch)
	}
	// A user who is not held has no device: bye is a no-op, not an error.
	h.wantNone("Bye before Load", h.bye(t0, "u", "d"))
	if s := h.get(t0, "u"); s.Known {
		t.Errorf("Get after failed ops: got Known=true (%+v), want false", s)
	}
	if _, _, ok, err := h.s.Debug(h.ctx, "u"); err != nil || ok {
		t.Errorf("Debug after failed ops: got ok=%v err=%v, want ok=false", ok, err)
	}
	h.wantNoEvents("Expire", h.expire(t0+time.Hour.Milliseconds()))

	// Loaded, the same operations work.
	h.load(t0, presence.Profile{UserID: "u"})
	if _, err := h.s.Beat(h.ctx, t0, "u", "d", true); err != nil {
		t.Errorf("Beat after Load: %v", err)
	}
}

func testLoadInsertsIfAbsent(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	first := presence.Profile{
		UserID:      "u",
		Manual:      presence.ManualBusy,
		Text:        "in a meeting",
		LastSeen:    t0 - 10*minute,
		PubLastSeen: t0 - 20*minute,
		Version:     42,
		Settings:    presence.Settings{Status: presence.Contacts, LastSeen: presence.Nobody},
	}
	h.load(t0, first)
	check := func(what string, now int64, wantStatus presence.Status, wantDevices int, wantLastSeen, wantPub int64, wantVersion uint64) {
		t.Helper()
		s := h.get(now, "u")
		h.wantSnap(what, s, wantStatus, wantDevices, wantLastSeen, wantPub)
		if s.UserID != "u" || s.Manual != first.Manual || s.Text != first.Text || s.Settings != first.Settings || s.Version != wantVersion {
			t.Errorf("%s: got %+v, want the first profile %+v (version %d)", what, s, first, wantVersion)
		}
	}
	check("after Load", t0, presence.Offline, 0, first.LastSeen, first.PubLastSeen, 42)

	second := presence.Profile{UserID: "u", Manual: presence.ManualInvisible, Text: "other", Version: 7}
	h.load(t0, second)
	check("after second Load", t0, presence.Offline, 0, first.LastSeen, first.PubLastSeen, 42)

	// The loaded manual status applies to the first beat.
	e := h.wantEvent("first beat", h.beat(t0+sec, "u", "d", true),
		ev{user: "u", prev: presence.Offline, status: presence.Busy, text: "in a meeting", lastSeen: t0 + sec, at: t0 + sec})
	if e.Version <= 42 {
		t.Errorf("first beat: got version %d, want more than the loaded 42", e.Version)
	}

	// Loading again while the user is live changes nothing either.
	h.load(t0+2*sec, second)
	check("Load while live", t0+2*sec, presence.Busy, 1, t0+sec, t0+sec, e.Version)
}

func testFirstBeatOnline(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	h.load(t0, presence.Profile{UserID: "u"})
	now := t0 + 5
	e := h.wantEvent("first beat", h.beat(now, "u", "phone", true),
		ev{user: "u", prev: presence.Offline, status: presence.Online, lastSeen: now, at: now})
	s := h.get(now, "u")
	h.wantSnap("after first beat", s, presence.Online, 1, now, now)
	if s.Version != e.Version {
		t.Errorf("Get version: got %d, want the event's %d", s.Version, e.Version)
	}
}

func testBeatWithoutChange(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	first := h.wantEvent("first beat", h.join(t0, "u", "d"), ev{user: "u", status: presence.Online})
	for i, now := range []int64{t0, t0 + 10*sec, t0 + 25*sec, t0 + 39*sec} {
		h.wantNone(fmt.Sprintf("beat %d at +%dms", i, now-t0), h.beat(now, "u", "d", true))
		h.wantNoEvents("Expire", h.expire(now))
	}
	s := h.get(t0+39*sec, "u")
	h.wantSnap("after beats", s, presence.Online, 1, t0+39*sec, t0+39*sec)
	if s.Version != first.Version {
		t.Errorf("version after beats without change: got %d, want %d", s.Version, first.Version)
	}
}

func testTTLBoundary(t *testing.T, f Factory) {
	for _, rules := range []presence.Rules{
		DefaultRules,
		{TTL: 7 * time.Second, IdleAfter: time.Minute},
		{TTL: 90 * time.Second, IdleAfter: 10 * time.Minute},
	} {
		t.Run(fmt.Sprintf("ttl=%v", rules.TTL), func(t *testing.T) {
			h := newH(t, f, rules)
			h.join(t0, "u", "d")
			last := t0 + h.ttl()/2
			h.wantNone("second beat", h.beat(last, "u", "d", true))
			end := last + h.ttl()

			h.wantSnap("Get at ttl-1ms", h.get(end-1, "u"), presence.Online, 1, last, last)
			h.wantNoEvents("Expire at ttl-1ms", h.expire(end-1))
			h.wantSnap("Get at ttl-1ms after Expire", h.get(end-1, "u"), presence.Online, 1, last, last)

			h.wantSnap("Get at ttl", h.get(end, "u"), presence.Offline, 0, last, last)
			h.wantOne("Expire at ttl", h.expire(end),
				ev{user: "u", prev: presence.Online, status: presence.Offline, lastSeen: last, at: end})
			h.wantNoEvents("Expire again", h.expire(end))
			h.wantNoEvents("Expire much later", h.expire(end+time.Hour.Milliseconds()))
			h.wantSnap("Get after expiry", h.get(end+1, "u"), presence.Offline, 0, last, last)
		})
	}
}

func testLateSweepLastSeen(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	h.join(t0, "u", "d")
	last := t0 + 12*sec
	h.beat(last, "u", "d", false)
	late := last + h.ttl() + 17*sec
	e := h.wantOne("late Expire", h.expire(late),
		ev{user: "u", prev: presence.Online, status: presence.Offline, lastSeen: last, at: late})
	if e.LastSeen == late || e.LastSeen == last+h.ttl() {
		t.Errorf("offline event LastSeen: got %d, want the last beat %d, not the expiry", e.LastSeen, last)
	}
	h.wantSnap("Get", h.get(late, "u"), presence.Offline, 0, last, last)
}

func testIdleThenActive(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	h.wantEvent("first beat", h.join(t0, "u", "d"), ev{user: "u", status: presence.Online})
	// The last activity is off the 10s grid of the beats, so the user goes
	// idle at a moment when no ttl deadline is due.
	active := t0 + 1234
	h.wantNone("active beat", h.beat(active, "u", "d", true))
	idleAt := active + h.idle()
	var last int64
	for now := t0 + 10*sec; now < idleAt; now += 10 * sec {
		h.wantNone("inactive beat", h.beat(now, "u", "d", false))
		h.wantNoEvents(fmt.Sprintf("Expire at +%ds", (now-t0)/sec), h.expire(now))
		last = now
	}
	h.wantNoEvents("Expire at idle_after-1ms", h.expire(idleAt-1))
	h.wantSnap("Get at idle_after-1ms", h.get(idleAt-1, "u"), presence.Online, 1, last, last)
	h.wantOne("Expire at idle_after", h.expire(idleAt),
		ev{user: "u", prev: presence.Online, status: presence.Away, lastSeen: last, at: idleAt})
	h.wantSnap("Get when idle", h.get(idleAt, "u"), presence.Away, 1, last, last)

	back := idleAt + 3*sec
	h.wantEvent("active beat", h.beat(back, "u", "d", true),
		ev{user: "u", prev: presence.Away, status: presence.Online, lastSeen: back, at: back})
	h.wantSnap("Get after active beat", h.get(back, "u"), presence.Online, 1, back, back)
	// And idle again, one idle_after after the new activity, without a
	// sweep in between.
	for now := back + 7*sec; now < back+h.idle(); now += 7 * sec {
		h.wantNone("inactive beat", h.beat(now, "u", "d", false))
		last = now
	}
	h.wantOne("Expire after the second idle", h.expire(back+h.idle()),
		ev{user: "u", prev: presence.Online, status: presence.Away, lastSeen: last, at: back + h.idle()})
	// An inactive beat after the idle moment also shows away, sweep or not.
	h.wantEvent("active beat", h.beat(back+h.idle()+sec, "u", "d", true),
		ev{user: "u", prev: presence.Away, status: presence.Online})
	h.wantEvent("inactive beat after idle_after", h.beat(back+2*h.idle()+sec, "u", "d", false),
		ev{user: "u", prev: presence.Online, status: presence.Away, at: back + 2*h.idle() + sec})
}

func testInactiveBeatsStayAway(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	h.load(t0, presence.Profile{UserID: "u"})
	h.wantEvent("first inactive beat", h.beat(t0, "u", "d", false),
		ev{user: "u", prev: presence.Offline, status: presence.Away, lastSeen: t0})
	var now int64
	for now = t0 + 10*sec; now <= t0+3*h.idle(); now += 10 * sec {
		h.wantNone("inactive beat", h.beat(now, "u", "d", false))
		h.wantNoEvents("Expire", h.expire(now))
	}
	h.wantSnap("Get", h.get(now, "u"), presence.Away, 1, now-10*sec, now-10*sec)
	h.wantEvent("active beat", h.beat(now, "u", "d", true), ev{user: "u", prev: presence.Away, status: presence.Online})
}

func testTwoDevices(t *testing.T, f Factory) {
	tests := []struct {
		name       string
		phoneLast  int64 // the phone's last beat
		laptopLast int64 // the laptop's last beat
	}{
		{"laptop dies first", t0 + 50*sec, t0 + 5*sec},
		{"phone dies first", t0 + 1*sec, t0 + 70*sec},
		{"both die together", t0 + 20*sec, t0 + 20*sec},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newH(t, f, DefaultRules)
			h.wantEvent("phone", h.join(t0, "u", "phone"), ev{user: "u", status: presence.Online})
			h.wantNone("laptop", h.beat(t0+sec/2, "u", "laptop", true))
			h.wantSnap("both alive", h.get(t0+sec, "u"), presence.Online, 2, t0+sec/2, t0+sec/2)
			for now := t0 + sec; now <= max(tt.phoneLast, tt.laptopLast); now += sec {
				if now <= tt.phoneLast && (now-t0)%(10*sec) == 0 || now == tt.phoneLast {
					h.wantNone("phone beat", h.beat(now, "u", "phone", true))
				}
				if now <= tt.laptopLast && (now-t0)%(10*sec) == 0 || now == tt.laptopLast {
					h.wantNone("laptop beat", h.beat(now, "u", "laptop", true))
				}
				h.wantNoEvents("Expire while one lives", h.expire(now))
			}
			last := max(tt.phoneLast, tt.laptopLast)
			lastEnd := last + h.ttl()
			wantDevices := 1
			if tt.phoneLast == tt.laptopLast {
				wantDevices = 2
			}
			h.wantSnap("before the last device dies", h.get(lastEnd-1, "u"), presence.Online, wantDevices, last, last)
			h.wantNoEvents("Expire before the last device dies", h.expire(lastEnd-1))
			h.wantOne("Expire when the last device dies", h.expire(lastEnd),
				ev{user: "u", prev: presence.Online, status: presence.Offline, lastSeen: last, at: lastEnd})
			h.wantNoEvents("Expire after", h.expire(lastEnd+time.Hour.Milliseconds()))
		})
	}
}

func testConcurrentDevices(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	const users, beats = 64, 20
	devices := []string{"phone", "laptop"}
	for u := range users {
		h.load(t0, presence.Profile{UserID: fmt.Sprint("u", u)})
	}
	var (
		mu     sync.Mutex // guards events
		events = map[string][]presence.Event{}
		wg     sync.WaitGroup
		errs   = make(chan error, users*len(devices))
	)
	for u := range users {
		for _, d := range devices {
			wg.Go(func() {
				user := fmt.Sprint("u", u)
				for i := range beats {
					ch, err := h.s.Beat(h.ctx, t0+int64(i)*sec, user, d, true)
					if err != nil {
						errs <- fmt.Errorf("Beat(%s, %s): %w", user, d, err)
						return
					}
					if ch.Changed {
						mu.Lock()
						events[user] = append(events[user], ch.Event)
						mu.Unlock()
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	now := t0 + beats*sec
	for u := range users {
		user := fmt.Sprint("u", u)
		got := events[user]
		if len(got) != 1 || got[0].Prev != presence.Offline || got[0].Status != presence.Online {
			t.Errorf("%s: got %d events %+v, want exactly one offline→online", user, len(got), got)
		}
		if s := h.get(now, user); s.Status != presence.Online || s.Devices != 2 {
			t.Errorf("%s: got status %v with %d devices, want online with 2", user, s.Status, s.Devices)
		}
	}
	last := t0 + (beats-1)*sec
	h.wantNoEvents("Expire before ttl", h.expire(last+h.ttl()-1))
	if got := h.expire(last + h.ttl()); len(got) != users {
		t.Errorf("Expire at ttl: got %d events, want %d (one offline per user)", len(got), users)
	}
}

func testReconnectInsideTTL(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	h.wantEvent("first beat", h.join(t0, "u", "d"), ev{user: "u", status: presence.Online})
	// The connection drops right after the beat at t0; a new connection
	// (maybe a new device id: the app reinstalled its socket) beats again
	// just before the ttl runs out.
	back := t0 + h.ttl() - 1
	for now := t0 + sec; now < back; now += sec {
		h.wantNoEvents("Expire while disconnected", h.expire(now))
		h.wantSnap("Get while disconnected", h.get(now, "u"), presence.Online, 1, t0, t0)
	}
	h.wantNone("reconnect on the same device", h.beat(back, "u", "d", true))
	h.wantNoEvents("Expire at the old ttl", h.expire(t0+h.ttl()))
	h.wantNone("reconnect on a new device", h.beat(back+h.ttl()-1, "u", "d2", true))
	h.wantNoEvents("Expire when the first device dies", h.expire(back+h.ttl()))
	h.wantSnap("Get", h.get(back+h.ttl(), "u"), presence.Online, 1, back+h.ttl()-1, back+h.ttl()-1)
}

func testBye(t *testing.T, f Factory) {
	t.Run("last device", func(t *testing.T) {
		h := newH(t, f, DefaultRules)
		h.join(t0, "u", "d")
		at := t0 + 4*sec
		h.wantEvent("bye", h.bye(at, "u", "d"),
			ev{user: "u", prev: presence.Online, status: presence.Offline, lastSeen: at, at: at})
		h.wantSnap("Get after bye", h.get(at, "u"), presence.Offline, 0, at, at)
		h.wantNoEvents("Expire after bye", h.expire(t0+h.ttl()+time.Hour.Milliseconds()))
		h.wantNone("second bye", h.bye(at+1, "u", "d"))
	})
	t.Run("one of two", func(t *testing.T) {
		h := newH(t, f, DefaultRules)
		h.join(t0, "u", "phone")
		h.beat(t0+sec, "u", "laptop", true)
		h.wantNone("bye of laptop", h.bye(t0+2*sec, "u", "laptop"))
		h.wantSnap("Get after bye", h.get(t0+2*sec, "u"), presence.Online, 1, t0+2*sec, t0+2*sec)
		h.wantNone("bye of unknown device", h.bye(t0+3*sec, "u", "tablet"))
		h.wantOne("phone dies", h.expire(t0+h.ttl()),
			ev{user: "u", prev: presence.Online, status: presence.Offline, lastSeen: t0 + 2*sec, at: t0 + h.ttl()})
	})
	t.Run("dead device", func(t *testing.T) {
		h := newH(t, f, DefaultRules)
		h.join(t0, "u", "d")
		// The ttl ran out but no sweep ran yet: the bye is not a sign of life.
		late := t0 + h.ttl() + 5*sec
		h.wantEvent("bye after ttl", h.bye(late, "u", "d"),
			ev{user: "u", prev: presence.Online, status: presence.Offline, lastSeen: t0})
		h.wantNoEvents("Expire", h.expire(late))
	})
}

func (h *h) disconnect(now int64, user, device string, since int64) presence.Change {
	h.t.Helper()
	ch, err := h.s.Disconnect(h.ctx, now, user, device, since)
	if err != nil {
		h.t.Fatalf("Disconnect(%d, %q, %q, %d): %v", now, user, device, since, err)
	}
	return ch
}

// testDisconnect: a connection that closes without a bye shortens its
// device's life to the close grace, unless the device beats again.
func testDisconnect(t *testing.T, f Factory) {
	rules := DefaultRules
	rules.CloseGrace = 5 * time.Second
	grace := rules.CloseGrace.Milliseconds()
	t.Run("departure within the grace", func(t *testing.T) {
		h := newH(t, f, rules)
		h.join(t0, "u", "d")
		h.beat(t0+5*sec, "u", "d", true)
		c := t0 + 6*sec
		h.wantNone("disconnect", h.disconnect(c, "u", "d", t0+5*sec))
		h.wantNoEvents("Expire before the grace ends", h.expire(c+grace-1))
		h.wantSnap("Get before the grace ends", h.get(c+grace-1, "u"), presence.Online, 1, t0+5*sec, t0+5*sec)
		h.wantOne("Expire when the grace ends", h.expire(c+grace),
			ev{user: "u", prev: presence.Online, status: presence.Offline, lastSeen: t0 + 5*sec, at: c + grace})
		h.wantSnap("Get after", h.get(c+grace, "u"), presence.Offline, 0, t0+5*sec, t0+5*sec)
		h.wantNoEvents("Expire at the old ttl", h.expire(t0+5*sec+h.ttl()))
	})
	t.Run("reconnect within the grace", func(t *testing.T) {
		h := newH(t, f, rules)
		h.join(t0, "u", "d")
		c := t0 + sec
		h.wantNone("disconnect", h.disconnect(c, "u", "d", t0))
		back := c + grace - 1
		h.wantNone("reconnect", h.beat(back, "u", "d", true))
		h.wantNoEvents("Expire when the grace would have ended", h.expire(c+grace))
		h.wantNoEvents("Expire before the new ttl", h.expire(back+h.ttl()-1))
		h.wantSnap("Get", h.get(back+h.ttl()-1, "u"), presence.Online, 1, back, back)
		h.wantOne("Expire at the new ttl", h.expire(back+h.ttl()),
			ev{user: "u", prev: presence.Online, status: presence.Offline, lastSeen: back})
	})
	t.Run("a newer beat came through another connection", func(t *testing.T) {
		h := newH(t, f, rules)
		h.join(t0, "u", "d")
		h.beat(t0+2*sec, "u", "d", true) // the new connection's first beat
		// The old connection's close arrives late; its last beat was t0.
		h.wantNone("late disconnect", h.disconnect(t0+3*sec, "u", "d", t0))
		h.wantNoEvents("Expire after the grace", h.expire(t0+3*sec+grace))
		h.wantOne("Expire at the ttl of the newer beat", h.expire(t0+2*sec+h.ttl()),
			ev{user: "u", prev: presence.Online, status: presence.Offline, lastSeen: t0 + 2*sec})
	})
	t.Run("a replayed older beat does not reopen", func(t *testing.T) {
		h := newH(t, f, rules)
		h.join(t0, "u", "d")
		c := t0 + 2*sec
		h.disconnect(c, "u", "d", t0)
		h.wantNone("older beat", h.beat(c-1, "u", "d", true))
		h.wantOne("Expire when the grace ends", h.expire(c+grace),
			ev{user: "u", prev: presence.Online, status: presence.Offline, lastSeen: c - 1})
	})
	t.Run("a second disconnect does not extend the grace", func(t *testing.T) {
		h := newH(t, f, rules)
		h.join(t0, "u", "d")
		c := t0 + sec
		h.disconnect(c, "u", "d", t0)
		h.disconnect(c+2*sec, "u", "d", t0)
		h.wantOne("Expire when the first grace ends", h.expire(c+grace),
			ev{user: "u", prev: presence.Online, status: presence.Offline, lastSeen: t0})
	})
	t.Run("the ttl ends first", func(t *testing.T) {
		h := newH(t, f, rules)
		h.join(t0, "u", "d")
		c := t0 + h.ttl() - sec
		h.disconnect(c, "u", "d", t0)
		h.wantOne("Expire at the ttl", h.expire(t0+h.ttl()),
			ev{user: "u", prev: presence.Online, status: presence.Offline, lastSeen: t0, at: t0 + h.ttl()})
	})
	t.Run("another device stays", func(t *testing.T) {
		h := newH(t, f, rules)
		h.join(t0, "u", "phone")
		h.beat(t0+sec, "u", "laptop", true)
		h.disconnect(t0+2*sec, "u", "laptop", t0+sec)
		h.wantNoEvents("Expire when the laptop's grace ends", h.expire(t0+2*sec+grace))
		h.wantSnap("Get", h.get(t0+2*sec+grace, "u"), presence.Online, 1, t0+sec, t0+sec)
	})
	t.Run("unknown user and device", func(t *testing.T) {
		h := newH(t, f, rules)
		h.wantNone("unknown user", h.disconnect(t0, "nobody", "d", t0))
		h.join(t0, "u", "d")
		h.wantNone("unknown device", h.disconnect(t0+sec, "u", "other", t0+sec))
		h.wantNoEvents("Expire after the grace", h.expire(t0+sec+grace))
	})
	t.Run("invisible", func(t *testing.T) {
		h := newH(t, f, rules)
		h.join(t0, "u", "d")
		h.wantEvent("invisible", h.status(t0+sec, "u", presence.ManualInvisible, ""),
			ev{user: "u", prev: presence.Online, status: presence.Offline})
		h.disconnect(t0+2*sec, "u", "d", t0)
		h.wantNoEvents("Expire when the grace ends", h.expire(t0+2*sec+grace))
		h.wantSnap("Get", h.get(t0+2*sec+grace, "u"), presence.Offline, 0, t0+sec, t0+sec)
	})
	t.Run("grace off", func(t *testing.T) {
		off := rules
		off.CloseGrace = presence.NoCloseGrace
		h := newH(t, f, off)
		h.join(t0, "u", "d")
		h.beat(t0+sec, "u", "d", true)
		c := t0 + 2*sec
		h.wantEvent("disconnect", h.disconnect(c, "u", "d", t0+sec),
			ev{user: "u", prev: presence.Online, status: presence.Offline, lastSeen: t0 + sec})
		h.wantSnap("Get at the close", h.get(c, "u"), presence.Offline, 0, t0+sec, t0+sec)
		h.wantNoEvents("Expire after the close", h.expire(c+h.ttl()))
		h.wantEvent("a reconnect is a new arrival", h.beat(c+1, "u", "d", true),
			ev{user: "u", prev: presence.Offline, status: presence.Online, lastSeen: c + 1})
	})
	t.Run("grace as long as the ttl", func(t *testing.T) {
		off := rules
		off.CloseGrace = off.TTL
		h := newH(t, f, off)
		h.join(t0, "u", "d")
		h.disconnect(t0+sec, "u", "d", t0)
		h.wantNoEvents("Expire after a few seconds", h.expire(t0+sec+grace))
		h.wantOne("Expire at the ttl", h.expire(t0+h.ttl()),
			ev{user: "u", prev: presence.Online, status: presence.Offline, lastSeen: t0})
	})
}

func testManualStatus(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	h.join(t0, "u", "d")
	steps := []struct {
		m    presence.Manual
		text string
		want *ev // nil: no event
	}{
		{presence.ManualBusy, "", &ev{prev: presence.Online, status: presence.Busy}},
		{presence.ManualBusy, "", nil},
		{presence.ManualAway, "", &ev{prev: presence.Busy, status: presence.Away}},
		{presence.ManualNone, "", &ev{prev: presence.Away, status: presence.Online}}, // "online" clears
		{presence.ManualNone, "", nil},
		{presence.ManualBusy, "focus", &ev{prev: presence.Online, status: presence.Busy, text: "focus"}},
		{presence.ManualNone, "", &ev{prev: presence.Busy, status: presence.Online}},
	}
	for i, st := range steps {
		now := t0 + int64(i+1)*sec
		h.beat(now, "u", "d", true)
		what := fmt.Sprintf("step %d: set %v %q", i, st.m, st.text)
		ch := h.status(now, "u", st.m, st.text)
		if st.want == nil {
			h.wantNone(what, ch)
			continue
		}
		want := *st.want
		want.user, want.lastSeen, want.at = "u", now, now
		h.wantEvent(what, ch, want)
		s := h.get(now, "u")
		if s.Status != want.status || s.Manual != st.m || s.Text != st.text {
			t.Errorf("%s: Get got status %v manual %v text %q, want %v %v %q", what, s.Status, s.Manual, s.Text, want.status, st.m, st.text)
		}
	}
}

func testManualWhileOffline(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	h.load(t0, presence.Profile{UserID: "u"})
	h.wantNone("busy while offline", h.status(t0, "u", presence.ManualBusy, ""))
	h.wantNoEvents("Expire", h.expire(t0+time.Hour.Milliseconds()))
	if s := h.get(t0, "u"); s.Status != presence.Offline || s.Manual != presence.ManualBusy {
		t.Errorf("Get: got status %v manual %v, want offline with manual busy", s.Status, s.Manual)
	}
	at := t0 + 2*time.Hour.Milliseconds()
	h.wantEvent("first beat", h.beat(at, "u", "d", true),
		ev{user: "u", prev: presence.Offline, status: presence.Busy, lastSeen: at, at: at})

	// A device that died but was not swept yet: still no event for the status.
	h.wantOne("expiry", h.expire(at+h.ttl()), ev{user: "u", prev: presence.Busy, status: presence.Offline, lastSeen: at})
	h.wantNone("away while offline", h.status(at+h.ttl()+1, "u", presence.ManualAway, ""))
	h.wantEvent("beat", h.beat(at+h.ttl()+2, "u", "d", true), ev{user: "u", prev: presence.Offline, status: presence.Away})
}

func testManualIgnoresIdle(t *testing.T, f Factory) {
	for _, m := range []presence.Manual{presence.ManualBusy, presence.ManualAway, presence.ManualInvisible} {
		t.Run(m.String(), func(t *testing.T) {
			h := newH(t, f, DefaultRules)
			h.join(t0, "u", "d")
			h.status(t0, "u", m, "")
			var now int64
			for now = t0 + 10*sec; now <= t0+2*h.idle(); now += 10 * sec {
				h.beat(now, "u", "d", false)
				h.wantNoEvents("Expire", h.expire(now))
			}
			if s := h.get(now, "u"); s.Status != m.Status() {
				t.Errorf("Get after idle: got %v, want %v", s.Status, m.Status())
			}
			// Clearing it after a long idle shows away, not online.
			want := ev{user: "u", prev: m.Status().Public(), status: presence.Away}
			ch := h.status(now, "u", presence.ManualNone, "")
			if want.prev == want.status {
				h.wantNone("clear", ch)
			} else {
				h.wantEvent("clear", ch, want)
			}
		})
	}
}

func testTextChange(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	h.join(t0, "u", "d")
	h.wantEvent("text", h.status(t0+1, "u", presence.ManualNone, "lunch"),
		ev{user: "u", prev: presence.Online, status: presence.Online, text: "lunch", at: t0 + 1})
	h.wantNone("same text", h.status(t0+2, "u", presence.ManualNone, "lunch"))
	h.wantEvent("busy keeps text", h.status(t0+3, "u", presence.ManualBusy, "lunch"),
		ev{user: "u", prev: presence.Online, status: presence.Busy, text: "lunch"})
	h.wantEvent("text again", h.status(t0+4, "u", presence.ManualBusy, "back at 2"),
		ev{user: "u", prev: presence.Busy, status: presence.Busy, text: "back at 2"})
	h.wantEvent("clear text", h.status(t0+5, "u", presence.ManualBusy, ""),
		ev{user: "u", prev: presence.Busy, status: presence.Busy})
	if s := h.get(t0+5, "u"); s.Text != "" || s.Status != presence.Busy {
		t.Errorf("Get: got status %v text %q, want busy with no text", s.Status, s.Text)
	}
}

func testInvisible(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	h.join(t0, "u", "d")
	lastVisible := t0 + 10*sec
	h.beat(lastVisible, "u", "d", true)

	// Going invisible emits exactly what a bye at this moment would: the
	// offline event at once, with the public last_seen frozen at the moment
	// of going invisible (not at the last beat, which a bye would not show
	// either). Choosing a status is itself a sign of life, so the true
	// last_seen moves to that moment too.
	at := t0 + 12*sec
	h.wantEvent("invisible", h.status(at, "u", presence.ManualInvisible, ""),
		ev{user: "u", prev: presence.Online, status: presence.Offline, lastSeen: at, at: at})
	h.wantSnap("Get after invisible", h.get(at, "u"), presence.Invisible, 1, at, at)

	// The user goes on using the app: nothing leaks.
	var now int64
	for now = at + 5*sec; now < at+h.idle()+h.ttl(); now += 10 * sec {
		h.wantNone("beat while invisible", h.beat(now, "u", "d", true))
		h.wantNone("second device while invisible", h.beat(now, "u", "d2", false))
		h.wantNoEvents("Expire while invisible", h.expire(now))
	}
	last := now - 10*sec
	h.wantSnap("Get while invisible", h.get(last, "u"), presence.Invisible, 2, last, at)
	h.wantNone("bye of one device while invisible", h.bye(last+1, "u", "d2"))
	h.wantSnap("Get after bye", h.get(last+1, "u"), presence.Invisible, 1, last+1, at)

	// Back to online: one online event showing this very moment, as a real
	// return would (not the last beat sent while invisible).
	h.wantEvent("online", h.status(last+2, "u", presence.ManualNone, ""),
		ev{user: "u", prev: presence.Offline, status: presence.Online, lastSeen: last + 2, at: last + 2})
	h.wantSnap("Get after online", h.get(last+2, "u"), presence.Online, 1, last+2, last+2)
}

func testInvisibleDevicesDie(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	h.join(t0, "u", "d")
	vanished := t0 + sec
	h.wantEvent("invisible", h.status(vanished, "u", presence.ManualInvisible, ""),
		ev{user: "u", prev: presence.Online, status: presence.Offline, lastSeen: vanished, at: vanished})
	last := t0 + 20*sec
	h.beat(last, "u", "d", true)
	h.wantNoEvents("Expire when the device dies", h.expire(last+h.ttl()))
	h.wantSnap("Get after death", h.get(last+h.ttl(), "u"), presence.Offline, 0, last, vanished)
	// Still invisible when they come back.
	h.wantNone("beat", h.beat(last+time.Hour.Milliseconds(), "u", "d", true))
	h.wantNone("bye", h.bye(last+time.Hour.Milliseconds()+1, "u", "d"))
	if s := h.get(last+time.Hour.Milliseconds()+1, "u"); s.PubLastSeen != vanished || s.Manual != presence.ManualInvisible {
		t.Errorf("Get: got pub_last_seen %d manual %v, want %d invisible", s.PubLastSeen, s.Manual, vanished)
	}
}

func testInvisibleWhileOffline(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	h.load(t0, presence.Profile{UserID: "u", LastSeen: t0 - minute, PubLastSeen: t0 - minute})
	h.wantNone("invisible while offline", h.status(t0, "u", presence.ManualInvisible, ""))
	h.wantNone("first beat", h.beat(t0+sec, "u", "d", true))
	h.wantSnap("Get", h.get(t0+sec, "u"), presence.Invisible, 1, t0+sec, t0-minute)
	h.wantNoEvents("Expire", h.expire(t0+sec+h.ttl()))
}

// testInvisibleLikeBye plays two users with the same history, except that
// at one moment "b" says bye on every device and "i" goes invisible (and
// then goes on using the app). Everything another viewer can observe —
// events, the filtered view, what is checkpointed for later reads — must
// be the same for both, ids aside.
func testInvisibleLikeBye(t *testing.T, f Factory) {
	tests := []struct {
		name    string
		devices []string
		text    string
		at      int64 // the moment of the bye or of going invisible
		// retext, if set, is the text i sets while invisible after the
		// moment (a new one each time): only i is told.
		retext string
	}{
		{"one device", []string{"d"}, "", t0 + 12*sec + 345, ""},
		{"two devices with text", []string{"phone", "laptop"}, "in a meeting", t0 + 12*sec + 345, ""},
		{"in the same millisecond as a beat", []string{"d"}, "", t0 + 10*sec, ""},
		// The ttl ran out but no sweep ran yet: both read as an expiry at
		// the last beat.
		{"devices already dead", []string{"d"}, "", t0 + 10*sec + DefaultRules.TTL.Milliseconds() + 5*sec, ""},
		{"text changed while invisible", []string{"phone", "laptop"}, "in a meeting", t0 + 12*sec + 345, "gone fishing"},
		{"text cleared while invisible", []string{"d"}, "in a meeting", t0 + 12*sec + 345, "-"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newH(t, f, DefaultRules)
			// Both users publish the same events up to the moment.
			var events [2][]presence.Event
			add := func(k int, chs ...presence.Change) {
				for _, ch := range chs {
					if ch.Changed {
						events[k] = append(events[k], ch.Event)
					}
				}
			}
			users := [2]string{"b", "i"}
			for k, u := range users {
				h.load(t0, presence.Profile{UserID: u})
				for _, d := range tt.devices {
					add(k, h.beat(t0, u, d, true))
				}
				if tt.text != "" {
					add(k, h.status(t0+5*sec, u, presence.ManualNone, tt.text))
				}
				add(k, h.beat(t0+10*sec, u, tt.devices[0], true))
			}
			// The moment: b says bye everywhere, i goes invisible.
			for _, d := range tt.devices {
				add(0, h.bye(tt.at, "b", d))
			}
			add(1, h.status(tt.at, "i", presence.ManualInvisible, tt.text))

			if len(events[0]) == 0 || events[0][len(events[0])-1].Status != presence.Offline {
				t.Fatalf("bye: got events %v, want an offline event last", events[0])
			}
			lastSeen := tt.at // a bye is a sign of life
			if tt.at >= t0+10*sec+h.ttl() {
				lastSeen = t0 + 10*sec // the devices had died: the last beat
			}
			h.wantEvent("offline of the bye", presence.Change{Changed: true, Event: events[0][len(events[0])-1]},
				ev{user: "b", prev: presence.Online, status: presence.Offline, text: tt.text, lastSeen: lastSeen, at: tt.at})
			same := func(what string, now int64) {
				t.Helper()
				// What i alone is told is not for anyone else.
				var others []presence.Event
				for _, e := range events[1] {
					if !e.SelfOnly {
						others = append(others, e)
					}
				}
				if len(events[0]) != len(others) {
					t.Fatalf("%s: bye user published %d events, invisible user %d for others", what, len(events[0]), len(others))
				}
				for j := range events[0] {
					a, b := events[0][j], others[j]
					a.UserID, b.UserID = "", ""
					// Only the user's own sockets see Self: invisible.
					if b.Self == presence.Invisible {
						b.Self = a.Self
					}
					b.SelfText = a.SelfText
					if a != b {
						t.Errorf("%s: event %d of the bye user %s, of the invisible user %s", what, j, gotEv(events[0][j]), gotEv(others[j]))
					}
				}
				sb, si := h.get(now, "b"), h.get(now, "i")
				for _, set := range []presence.Settings{{}, {Status: presence.Contacts, LastSeen: presence.Contacts}} {
					sb.Settings, si.Settings = set, set
					for _, rel := range []privacy.Relation{{}, {Contact: true}} {
						vb, vi := privacy.Filter(rel, &sb), privacy.Filter(rel, &si)
						vb.UserID, vi.UserID = "", ""
						if vb != vi {
							t.Errorf("%s, settings %+v, relation %+v: the bye user reads %+v, the invisible user %+v", what, set, rel, vb, vi)
						}
					}
				}
				if sb.PubLastSeen != lastSeen || si.PubLastSeen != lastSeen {
					t.Errorf("%s: public last_seen of the bye user %d, of the invisible user %d, want %d", what, sb.PubLastSeen, si.PubLastSeen, lastSeen)
				}
			}
			same("at the moment", tt.at)

			// What is checkpointed and served once the users are no longer
			// held is the same too.
			dirty := map[string]presence.Profile{}
			for _, p := range h.dirty() {
				dirty[p.UserID] = p
			}
			if b, i := dirty["b"], dirty["i"]; b.PubLastSeen != i.PubLastSeen || b.Version != i.Version || b.PubLastSeen != lastSeen {
				t.Errorf("checkpoint: bye user pub_last_seen %d version %d, invisible user %d %d; want both at %d with one version",
					b.PubLastSeen, b.Version, i.PubLastSeen, i.Version, lastSeen)
			}

			// i goes on using the app for a while, then its devices die
			// silently: nothing of it may show.
			now := tt.at
			for round := 0; now < tt.at+h.idle()+2*h.ttl(); now += 10 * sec {
				if now < tt.at+h.idle() {
					for _, d := range tt.devices {
						add(1, h.beat(now, "i", d, true))
					}
				}
				add(0, h.expire(now)...)
				text := tt.text
				switch {
				case tt.retext == "-":
					text = ""
				case tt.retext != "":
					round++
					text = fmt.Sprint(tt.retext, " ", round)
				}
				add(1, h.status(now, "i", presence.ManualInvisible, text))
				if si := h.get(now, "i"); si.Text != text {
					t.Errorf("%dms after the moment: i reads its own text %q, want %q", now-tt.at, si.Text, text)
				}
				same(fmt.Sprintf("%dms after the moment", now-tt.at), now)
			}
			for _, ch := range h.expire(now) {
				add(map[string]int{"b": 0, "i": 1}[ch.Event.UserID], ch)
			}
			same("after the devices died", now)
			// Checkpointed, the public faces are the same too.
			dirty = map[string]presence.Profile{}
			for _, p := range h.dirty() {
				dirty[p.UserID] = p
			}
			if i, ok := dirty["i"]; ok {
				b := dirty["b"]
				if _, ok := dirty["b"]; !ok {
					b = presence.Profile{Text: tt.text, Version: events[0][len(events[0])-1].Version}
				}
				bt, bv := b.Public()
				it, iv := i.Public()
				if bt != it || bv != iv || i.PubLastSeen != lastSeen {
					t.Errorf("checkpoint after the moment: the bye user shows %q v%d, the invisible user %q v%d last_seen %d (want %d)",
						bt, bv, it, iv, i.PubLastSeen, lastSeen)
				}
			}
		})
	}
}

func testVersionsIncrease(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	var got []presence.Event
	add := func(chs ...presence.Change) {
		for _, ch := range chs {
			if ch.Changed {
				got = append(got, ch.Event)
			}
		}
	}
	h.load(t0, presence.Profile{UserID: "u", Version: uint64(t0) * 1000}) // a version from "the future"
	// Several events in the same millisecond.
	add(h.beat(t0, "u", "d", true))
	add(h.status(t0, "u", presence.ManualBusy, ""))
	add(h.status(t0, "u", presence.ManualBusy, "a"))
	add(h.status(t0, "u", presence.ManualInvisible, "a"))
	add(h.status(t0, "u", presence.ManualNone, "a"))
	add(h.bye(t0, "u", "d"))
	add(h.beat(t0, "u", "d", true))
	// And across time, including expiry.
	add(h.beat(t0+1, "u", "d", false))
	add(h.expire(t0 + 1 + h.ttl())...)
	add(h.beat(t0+2*h.ttl(), "u", "d", false))
	add(h.beat(t0+2*h.ttl(), "u", "d", true))

	if len(got) != 10 {
		for _, e := range got {
			t.Logf("got %s", gotEv(e))
		}
		t.Fatalf("got %d events, want 10", len(got))
	}
	prev := uint64(t0) * 1000
	for i, e := range got {
		if e.Version <= prev {
			t.Errorf("event %d %s: version %d is not more than the previous %d", i, gotEv(e), e.Version, prev)
		}
		prev = e.Version
	}
	if s := h.get(t0+2*h.ttl(), "u"); s.Version != prev {
		t.Errorf("Get version: got %d, want the last event's %d", s.Version, prev)
	}
}

// testVersionsAboveEpoch: a version is the previous one plus one, never at
// or below Epoch<<32, so a run with a larger epoch stamps versions above any
// of an earlier run even when the earlier run's last versions were never
// checkpointed. Versions stay below 2^53, which JavaScript numbers hold
// exactly.
func testVersionsAboveEpoch(t *testing.T, f Factory) {
	const maxSafe = uint64(1) << 53
	for _, epoch := range []uint64{1, 7, 1 << 20} {
		t.Run(fmt.Sprint("epoch=", epoch), func(t *testing.T) {
			rules := DefaultRules
			rules.Epoch = epoch
			h := newH(t, f, rules)
			floor := epoch << 32
			profiles := []struct {
				p     presence.Profile
				first uint64 // version of the first event
			}{
				{presence.Profile{UserID: "new"}, floor + 1},
				// Checkpointed by an earlier run, however far it got.
				{presence.Profile{UserID: "earlier", Version: floor - 1}, floor + 1},
				{presence.Profile{UserID: "much-earlier", Version: 3}, floor + 1},
				// Already stamped in this run (loaded again after eviction).
				{presence.Profile{UserID: "this-run", Version: floor + 5}, floor + 6},
			}
			for _, tc := range profiles {
				h.load(t0, tc.p)
				u := tc.p.UserID
				e := h.wantEvent(u+" first beat", h.beat(t0, u, "d", true), ev{user: u, prev: presence.Offline, status: presence.Online})
				if e.Version != tc.first {
					t.Errorf("%s (loaded version %d): first event version %d, want %d", u, tc.p.Version, e.Version, tc.first)
				}
				// Then one by one, in the same millisecond or not.
				want := tc.first
				for i, ch := range []presence.Change{
					h.status(t0, u, presence.ManualBusy, ""),
					h.status(t0, u, presence.ManualBusy, "x"),
					h.bye(t0+sec, u, "d"),
					h.beat(t0+time.Hour.Milliseconds(), u, "d", true),
				} {
					want++
					if !ch.Changed || ch.Event.Version != want {
						t.Errorf("%s: change %d: got changed=%v version %d, want version %d", u, i, ch.Changed, ch.Event.Version, want)
					}
					if ch.Event.Version >= maxSafe {
						t.Errorf("%s: version %d is not below 2^53", u, ch.Event.Version)
					}
				}
				if s := h.get(t0+time.Hour.Milliseconds(), u); s.Version != want {
					t.Errorf("%s: Get version %d, want %d", u, s.Version, want)
				}
			}
		})
	}
}

// testVersionsIgnoreClock: versions count changes and say nothing about
// when they happened (a viewer must not learn the time of a hidden change
// from them): the same history played at two times far apart stamps the
// same versions.
func testVersionsIgnoreClock(t *testing.T, f Factory) {
	play := func(base int64) []uint64 {
		h := newH(t, f, DefaultRules)
		var vs []uint64
		for _, ch := range []presence.Change{
			h.join(base, "u", "d"),
			h.status(base+sec, "u", presence.ManualBusy, ""),
			h.status(base+7*sec, "u", presence.ManualInvisible, ""),
			h.status(base+25*sec, "u", presence.ManualNone, ""),
			h.bye(base+26*sec, "u", "d"),
			h.join(base+9*minute, "u", "d"),
		} {
			if !ch.Changed {
				t.Fatalf("at %d: got no change", base)
			}
			vs = append(vs, ch.Event.Version)
		}
		return vs
	}
	early, late := play(t0), play(t0+400*24*time.Hour.Milliseconds())
	if !slices.Equal(early, late) {
		t.Errorf("versions depend on the clock: %v at t0, %v 400 days later", early, late)
	}
	for i, v := range early {
		if v != uint64(i+1) {
			t.Errorf("with epoch 0, change %d has version %d, want %d", i, v, i+1)
		}
	}
}

// testDeviceCap: a heartbeat of a new device while Rules.MaxDevices are
// alive is refused with ErrTooManyDevices and changes nothing; the known
// devices keep beating, and a slot frees when a device says bye or dies.
func testDeviceCap(t *testing.T, f Factory) {
	rules := DefaultRules
	rules.MaxDevices = 3
	h := newH(t, f, rules)
	h.load(t0, presence.Profile{UserID: "u"})
	h.wantEvent("first device", h.beat(t0, "u", "d0", true), ev{user: "u", prev: presence.Offline, status: presence.Online})
	h.wantNone("second device", h.beat(t0, "u", "d1", true))
	h.wantNone("third device", h.beat(t0, "u", "d2", false))
	h.dirty()
	before := h.get(t0+sec, "u")

	refuse := func(what string, now int64, device string) {
		t.Helper()
		for _, active := range []bool{true, false} {
			ch, err := h.s.Beat(h.ctx, now, "u", device, active)
			if !errors.Is(err, presence.ErrTooManyDevices) {
				t.Errorf("%s: Beat(%q, active=%v) = %v, want ErrTooManyDevices", what, device, active, err)
			}
			h.wantNone(what, ch)
		}
	}
	refuse("fourth device", t0+sec, "d3")
	if got := h.get(t0+sec, "u"); got != before {
		t.Errorf("Get after the refused beat: got %+v, want %+v (unchanged: no device, no last_seen)", got, before)
	}
	if got := h.dirty(); len(got) != 0 {
		t.Errorf("Dirty after the refused beat: got %+v, want nothing", got)
	}
	if u, _, _, err := h.s.Debug(h.ctx, "u"); err != nil || len(u.Devices) != 3 {
		t.Errorf("Debug after the refused beat: got %d devices (%v), want 3", len(u.Devices), err)
	} else {
		for _, d := range u.Devices {
			if d.ID == "d3" {
				t.Errorf("Debug: the refused device is held: %+v", u.Devices)
			}
		}
	}

	// The known devices keep beating; other users have their own cap.
	h.wantNone("known device at the cap", h.beat(t0+2*sec, "u", "d0", true))
	h.wantNone("known device at the cap", h.beat(t0+2*sec, "u", "d2", true))
	for i := range 3 {
		h.load(t0, presence.Profile{UserID: "v"})
		h.beat(t0+2*sec, "v", fmt.Sprint("d", i), true)
	}
	h.wantSnap("the other user", h.get(t0+2*sec, "v"), presence.Online, 3, t0+2*sec, t0+2*sec)

	// A bye frees a slot.
	h.wantNone("bye", h.bye(t0+3*sec, "u", "d1"))
	h.wantNone("fourth device after a bye", h.beat(t0+4*sec, "u", "d3", true))
	refuse("fifth device", t0+5*sec, "d4")

	// A dead device frees its slot, swept or not: d0 and d2 beat last at
	// +2s, d3 at +4s.
	dead := t0 + 2*sec + h.ttl()
	h.wantNone("a new device when two died", h.beat(dead, "u", "d4", true))
	h.wantNone("another", h.beat(dead, "u", "d5", true))
	refuse("one more", dead, "d6")
	h.wantSnap("Get", h.get(dead, "u"), presence.Online, 3, dead, dead)
	for _, ch := range h.expire(dead) {
		if ch.Event.UserID == "u" {
			t.Errorf("Expire: got %s, want no event of u", gotEv(ch.Event))
		}
	}
}

// testDefaultDeviceCap: with Rules.MaxDevices 0, the cap is
// presence.DefaultMaxDevices.
func testDefaultDeviceCap(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	h.load(t0, presence.Profile{UserID: "u"})
	for i := range presence.DefaultMaxDevices {
		h.beat(t0+int64(i), "u", fmt.Sprint("d", i), true)
	}
	now := t0 + presence.DefaultMaxDevices
	if _, err := h.s.Beat(h.ctx, now, "u", "one-more", true); !errors.Is(err, presence.ErrTooManyDevices) {
		t.Errorf("device %d: got %v, want ErrTooManyDevices", presence.DefaultMaxDevices+1, err)
	}
	h.wantSnap("Get", h.get(now, "u"), presence.Online, presence.DefaultMaxDevices, now-1, now-1)
}

func testExpireMax(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	const users = 10
	for i := range users {
		h.join(t0+int64(i), fmt.Sprint("u", i), "d")
	}
	now := t0 + users + h.ttl()
	seen := map[string]int{}
	var out []presence.Change
	for _, want := range []int{3, 3, 3, 1, 0, 0} {
		var err error
		out, err = h.s.Expire(h.ctx, now, 3, out[:0])
		if err != nil {
			t.Fatalf("Expire: %v", err)
		}
		if len(out) != want {
			t.Errorf("Expire(max=3): got %d changes, want %d", len(out), want)
		}
		for _, ch := range out {
			seen[ch.Event.UserID]++
			if !ch.Changed || ch.Event.Status != presence.Offline {
				t.Errorf("Expire: got %s, want an offline event", gotEv(ch.Event))
			}
		}
	}
	for i := range users {
		if u := fmt.Sprint("u", i); seen[u] != 1 {
			t.Errorf("%s: got %d offline events, want 1", u, seen[u])
		}
	}
}

func testExpireConcurrent(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	const users, sweepers, batch = 500, 8, 7
	for i := range users {
		h.join(t0+int64(i%50), fmt.Sprint("u", i), "d")
		if i%5 == 0 { // some users also have a second device dying at once
			h.beat(t0+int64(i%50), fmt.Sprint("u", i), "d2", true)
		}
	}
	now := t0 + 50 + h.ttl()
	var (
		mu   sync.Mutex // guards seen
		seen = map[string]int{}
		wg   sync.WaitGroup
	)
	for range sweepers {
		wg.Go(func() {
			var out []presence.Change
			for {
				var err error
				out, err = h.s.Expire(h.ctx, now, batch, out[:0])
				if err != nil {
					t.Errorf("Expire: %v", err)
					return
				}
				if len(out) > batch {
					t.Errorf("Expire(max=%d) returned %d changes", batch, len(out))
				}
				mu.Lock()
				for _, ch := range out {
					seen[ch.Event.UserID]++
				}
				mu.Unlock()
				if len(out) == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	total := 0
	for i := range users {
		u := fmt.Sprint("u", i)
		total += seen[u]
		if seen[u] != 1 {
			t.Errorf("%s: got %d offline events, want 1", u, seen[u])
		}
	}
	if total != users || len(seen) != users {
		t.Errorf("got %d events for %d users, want %d for %d", total, len(seen), users, users)
	}
	h.wantNoEvents("Expire after the sweepers", h.expire(now))
}

func testGet(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	h.load(t0, presence.Profile{UserID: "offline", LastSeen: t0 - minute, PubLastSeen: t0 - minute, Version: 3})
	h.join(t0, "one", "d")
	h.join(t0, "two", "d")
	h.beat(t0+sec, "two", "d2", false)

	ids := []string{"nobody", "one", "two", "offline", "one", "also-nobody"}
	out := make([]presence.Snapshot, len(ids))
	for i := range out { // stale content must be overwritten
		out[i] = presence.Snapshot{UserID: "stale", Known: true, Status: presence.Busy, Devices: 9, Version: 99}
	}
	now := t0 + 2*sec
	if err := h.s.Get(h.ctx, now, ids, out); err != nil {
		t.Fatalf("Get: %v", err)
	}
	want := []struct {
		known   bool
		status  presence.Status
		devices int
	}{
		{false, presence.Offline, 0},
		{true, presence.Online, 1},
		{true, presence.Online, 2},
		{true, presence.Offline, 0},
		{true, presence.Online, 1},
		{false, presence.Offline, 0},
	}
	for i, w := range want {
		g := out[i]
		if g.UserID != ids[i] || g.Known != w.known || g.Status != w.status || g.Devices != w.devices {
			t.Errorf("Get %q: got id=%q known=%v status=%v devices=%d, want id=%q known=%v status=%v devices=%d",
				ids[i], g.UserID, g.Known, g.Status, g.Devices, ids[i], w.known, w.status, w.devices)
		}
		if !w.known && (g.Version != 0 || g.LastSeen != 0 || g.Text != "") {
			t.Errorf("Get %q (unknown): got %+v, want an empty snapshot", ids[i], g)
		}
	}
	if g := out[3]; g.LastSeen != t0-minute || g.Version != 3 {
		t.Errorf("Get offline: got last_seen %d version %d, want %d 3", g.LastSeen, g.Version, t0-minute)
	}
	// Devices counts only the alive ones, at the time asked, even unswept.
	h.wantSnap("two after the first device died", h.get(t0+h.ttl(), "two"), presence.Away, 1, t0+sec, t0+sec)
	if err := h.s.Get(h.ctx, now, nil, nil); err != nil {
		t.Errorf("Get of no ids: %v", err)
	}
}

// testGetMany reads many ids at once (backends may group large reads),
// with duplicates and unknown ids mixed in, in an order unrelated to any
// sharding.
func testGetMany(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	const users = 300
	for i := range users {
		switch i % 3 {
		case 0: // unknown
		case 1: // offline, loaded
			h.load(t0, presence.Profile{UserID: fmt.Sprint("u", i), LastSeen: int64(i), Version: uint64(i)})
		case 2: // online with i%4+1 devices
			h.load(t0, presence.Profile{UserID: fmt.Sprint("u", i)})
			for d := range i%4 + 1 {
				h.beat(t0+int64(d), fmt.Sprint("u", i), fmt.Sprint("d", d), true)
			}
		}
	}
	for _, n := range []int{1, 15, 16, 17, 100, 2 * users} {
		ids := make([]string, n)
		for j := range ids {
			ids[j] = fmt.Sprint("u", (j*7919+n)%users)
		}
		out := make([]presence.Snapshot, n)
		for j := range out {
			out[j] = presence.Snapshot{UserID: "stale", Known: true, Devices: 9}
		}
		if err := h.s.Get(h.ctx, t0+10, ids, out); err != nil {
			t.Fatalf("Get of %d ids: %v", n, err)
		}
		for j, id := range ids {
			i := (j*7919 + n) % users
			g := out[j]
			wantKnown, wantStatus, wantDevices := i%3 != 0, presence.Offline, 0
			if i%3 == 2 {
				wantStatus, wantDevices = presence.Online, i%4+1
			}
			if g.UserID != id || g.Known != wantKnown || g.Status != wantStatus || g.Devices != wantDevices {
				t.Errorf("Get of %d ids, [%d] %q: got id=%q known=%v status=%v devices=%d, want known=%v status=%v devices=%d",
					n, j, id, g.UserID, g.Known, g.Status, g.Devices, wantKnown, wantStatus, wantDevices)
			}
			if i%3 == 1 && (g.LastSeen != int64(i) || g.Version != uint64(i)) {
				t.Errorf("Get of %d ids, [%d] %q: got last_seen %d version %d, want %d %d", n, j, id, g.LastSeen, g.Version, i, i)
			}
		}
	}
}

func testDirty(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	h.load(t0, presence.Profile{UserID: "a"})
	h.load(t0, presence.Profile{UserID: "b"})
	if got := h.dirty(); len(got) != 0 {
		t.Errorf("Dirty after Load: got %d profiles %+v, want none", len(got), got)
	}
	byUser := func(ps []presence.Profile) map[string]presence.Profile {
		m := map[string]presence.Profile{}
		for _, p := range ps {
			if _, dup := m[p.UserID]; dup {
				t.Errorf("Dirty returned %q twice", p.UserID)
			}
			m[p.UserID] = p
		}
		return m
	}

	e := h.wantEvent("a online", h.beat(t0, "a", "d", true), ev{user: "a", status: presence.Online})
	h.beat(t0+sec, "a", "d", true)
	h.beat(t0+2*sec, "a", "d", true)
	got := byUser(h.dirty())
	if len(got) != 1 {
		t.Errorf("Dirty after beats of a: got %d profiles, want 1", len(got))
	}
	if p := got["a"]; p.LastSeen != t0+2*sec || p.PubLastSeen != t0+2*sec || p.Version != e.Version {
		t.Errorf("Dirty a: got last_seen %d pub %d version %d, want %d %d %d", p.LastSeen, p.PubLastSeen, p.Version, t0+2*sec, t0+2*sec, e.Version)
	}
	if got := h.dirty(); len(got) != 0 {
		t.Errorf("second Dirty: got %d profiles, want none", len(got))
	}
	// Reads and sweeps that change nothing do not make anyone dirty.
	h.get(t0+3*sec, "a")
	h.wantNoEvents("Expire", h.expire(t0+3*sec))
	if got := h.dirty(); len(got) != 0 {
		t.Errorf("Dirty after Get and Expire: got %d profiles, want none", len(got))
	}

	// Dirty appends to out.
	h.beat(t0+4*sec, "a", "d", true)
	h.join(t0+4*sec, "b", "d")
	out := []presence.Profile{{UserID: "keep"}}
	out, err := h.s.Dirty(h.ctx, out)
	if err != nil {
		t.Fatalf("Dirty: %v", err)
	}
	if len(out) != 3 || out[0].UserID != "keep" {
		t.Errorf("Dirty(out): got %+v, want keep followed by a and b", out)
	}
	got = byUser(out[1:])
	if got["a"].LastSeen != t0+4*sec || got["b"].LastSeen != t0+4*sec {
		t.Errorf("Dirty: got %+v, want a and b seen at %d", got, t0+4*sec)
	}

	// A manual status is a change of version.
	busy := h.wantEvent("a busy", h.status(t0+4*sec, "a", presence.ManualBusy, ""), ev{user: "a", prev: presence.Online, status: presence.Busy})
	if p := byUser(h.dirty())["a"]; p.Version != busy.Version {
		t.Errorf("Dirty after busy: got a version %d, want %d", p.Version, busy.Version)
	}
	h.wantEvent("a online", h.status(t0+4*sec, "a", presence.ManualNone, ""), ev{user: "a", prev: presence.Busy, status: presence.Online})

	// Going offline is a change: the new version and the frozen last_seen.
	h.bye(t0+5*sec, "b", "d")
	off := h.wantOne("a offline", h.expire(t0+4*sec+h.ttl()), ev{user: "a", prev: presence.Online, status: presence.Offline})
	got = byUser(h.dirty())
	if p := got["a"]; p.Version != off.Version || p.LastSeen != t0+4*sec || p.PubLastSeen != t0+4*sec {
		t.Errorf("Dirty after offline: got a %+v, want version %d last_seen %d", p, off.Version, t0+4*sec)
	}
	if p := got["b"]; p.LastSeen != t0+5*sec {
		t.Errorf("Dirty after bye: got b last_seen %d, want %d", p.LastSeen, t0+5*sec)
	}
	if got := h.dirty(); len(got) != 0 {
		t.Errorf("Dirty after drain: got %d profiles, want none", len(got))
	}
}

func testSetSettings(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	h.load(t0, presence.Profile{UserID: "u", Settings: presence.Settings{LastSeen: presence.Contacts}})
	if got := h.get(t0, "u").Settings; got != (presence.Settings{LastSeen: presence.Contacts}) {
		t.Errorf("Settings after Load: got %+v", got)
	}
	h.beat(t0, "u", "d", true)
	h.dirty()
	prev := presence.Settings{LastSeen: presence.Contacts}
	version := h.get(t0, "u").Version
	for i, want := range []presence.Settings{
		{Status: presence.Nobody, LastSeen: presence.Contacts},
		{Status: presence.Contacts, LastSeen: presence.Nobody},
		{Status: presence.Contacts, LastSeen: presence.Nobody}, // the same again: a change all the same
		{},
	} {
		now := t0 + int64(i+1)*sec
		ch, err := h.s.SetSettings(h.ctx, now, "u", &want)
		if err != nil {
			t.Fatalf("SetSettings(%+v): %v", want, err)
		}
		// A change of settings is an event of its own: the state as last
		// published, a new version, the settings before and after.
		e := h.wantEvent(fmt.Sprintf("SetSettings(%+v)", want), ch, ev{user: "u", prev: presence.Online, status: presence.Online, at: now})
		if !e.SettingsOnly || !e.SettingsChanged || e.PrevSettings != prev || e.Settings != want || e.Self != presence.Online {
			t.Errorf("SetSettings(%+v): got event %+v, want SettingsOnly, PrevSettings %+v, Self online", want, e, prev)
		}
		if e.Version <= version {
			t.Errorf("SetSettings(%+v): version %d, want above %d", want, e.Version, version)
		}
		snap := h.get(now, "u")
		if snap.Settings != want || snap.Version != e.Version {
			t.Errorf("after SetSettings(%+v): got settings %+v version %d, want version %d", want, snap.Settings, snap.Version, e.Version)
		}
		// The new version is checkpointed like any other.
		if d := h.dirty(); len(d) != 1 || d[0].Version != e.Version {
			t.Errorf("Dirty after SetSettings: got %+v, want u at version %d", d, e.Version)
		}
		prev, version = want, e.Version
	}
	// nil keeps the settings and still stamps a version: the mark of a
	// change of who may see the user that is not in the settings.
	ch, err := h.s.SetSettings(h.ctx, t0+9*sec, "u", nil)
	if err != nil {
		t.Fatal(err)
	}
	if e := ch.Event; !ch.Changed || e.Version <= version || e.Settings != prev || e.PrevSettings != prev || !e.SettingsOnly {
		t.Errorf("SetSettings(nil): got %+v, want the settings %+v kept and a version above %d", ch, prev, version)
	}
	if got := h.get(t0+9*sec, "u").Settings; got != prev {
		t.Errorf("SetSettings(nil) changed the settings to %+v", got)
	}
	// An invisible user's change shows the public status, offline, and
	// the true one apart (what only the user's own sockets are shown).
	h.status(t0+10*sec, "u", presence.ManualInvisible, "")
	ch, err = h.s.SetSettings(h.ctx, t0+11*sec, "u", &presence.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	if e := ch.Event; e.Status != presence.Offline || e.Prev != presence.Offline || e.Self != presence.Invisible {
		t.Errorf("SetSettings of an invisible user: got status %v prev %v self %v, want offline offline invisible", e.Status, e.Prev, e.Self)
	}
	// Settings are not presence: they survive beats and expiry.
	want := presence.Settings{Status: presence.Nobody, LastSeen: presence.Nobody}
	if _, err := h.s.SetSettings(h.ctx, t0+12*sec, "u", &want); err != nil {
		t.Fatal(err)
	}
	h.beat(t0+13*sec, "u", "d", true)
	h.expire(t0 + 13*sec + h.ttl())
	if got := h.get(t0+13*sec+h.ttl(), "u").Settings; got != want {
		t.Errorf("Settings after beat and expiry: got %+v, want %+v", got, want)
	}
}

func testDebug(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	if _, _, ok, err := h.s.Debug(h.ctx, "u"); err != nil || ok {
		t.Errorf("Debug of unknown user: got ok=%v err=%v, want ok=false", ok, err)
	}
	h.join(t0, "u", "phone")
	h.beat(t0+sec, "u", "laptop", false)
	h.beat(t0+2*sec, "u", "phone", true)
	u, deadline, ok, err := h.s.Debug(h.ctx, "u")
	if err != nil || !ok {
		t.Fatalf("Debug: got ok=%v err=%v, want ok", ok, err)
	}
	if u.UserID != "u" || u.LastSeen != t0+2*sec || u.Pub != presence.Online || len(u.Devices) != 2 {
		t.Errorf("Debug: got %+v, want u online seen at %d with 2 devices", u, t0+2*sec)
	}
	devs := map[string]presence.Device{}
	for _, d := range u.Devices {
		devs[d.ID] = d
	}
	if d := devs["phone"]; d.LastBeat != t0+2*sec || d.LastActive != t0+2*sec {
		t.Errorf("Debug phone: got %+v, want beat and active at %d", d, t0+2*sec)
	}
	if d := devs["laptop"]; d.LastBeat != t0+sec || d.LastActive != 0 {
		t.Errorf("Debug laptop: got %+v, want beat at %d, never active", d, t0+sec)
	}
	// The index may hold an earlier deadline than the state needs (it is
	// rechecked when due), never a later one.
	if deadline <= t0 || deadline > t0+sec+h.ttl() {
		t.Errorf("Debug deadline: got %d, want in (%d, %d]", deadline, t0, t0+sec+h.ttl())
	}
	// The copy is the caller's.
	for i := range u.Devices {
		u.Devices[i].LastBeat = 0
	}
	if s := h.get(t0+3*sec, "u"); s.Devices != 2 {
		t.Errorf("Get after changing the Debug copy: got %d devices, want 2", s.Devices)
	}
}

// testInvisibleText: the text of a user who is invisible changes nothing
// anyone else sees — not the events, not the text or the version they
// read, not what is checkpointed for later reads —; the user alone is
// told, with a new version; everyone sees the text once the user is
// visible again, at a version above all of it.
func testInvisibleText(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	h.join(t0, "u", "d")
	h.wantEvent("text", h.status(t0+sec, "u", presence.ManualNone, "here"),
		ev{user: "u", prev: presence.Online, status: presence.Online, text: "here"})
	vanished := t0 + 2*sec
	gone := h.wantEvent("invisible with a text", h.status(vanished, "u", presence.ManualInvisible, "lunch"),
		ev{user: "u", prev: presence.Online, status: presence.Offline, text: "lunch", lastSeen: vanished})
	other := func(what string, now int64, wantSelf string, wantSelfVersion uint64) {
		t.Helper()
		s := h.get(now, "u")
		if v := privacy.Filter(privacy.Relation{}, &s); v.Text != "lunch" || v.Version != gone.Version || v.LastSeen != vanished || v.Status != presence.Offline {
			t.Errorf("%s: another viewer reads %+v, want offline %q at version %d, last_seen %d", what, v, "lunch", gone.Version, vanished)
		}
		if v := privacy.Filter(privacy.Relation{Self: true}, &s); v.Text != wantSelf || v.Version != wantSelfVersion {
			t.Errorf("%s: the user reads text %q version %d, want %q %d", what, v.Text, v.Version, wantSelf, wantSelfVersion)
		}
	}
	other("gone", vanished, "lunch", gone.Version)
	last := gone
	for i, text := range []string{"gone fishing", "", "back at 3"} {
		now := vanished + int64(i+1)*sec
		ch := h.status(now, "u", presence.ManualInvisible, text)
		e := ch.Event
		if !ch.Changed || !e.SelfOnly || e.Version <= last.Version || e.Status != presence.Offline || e.Prev != presence.Offline ||
			e.Text != "lunch" || e.LastSeen != vanished || e.Self != presence.Invisible || e.SelfText != text {
			t.Fatalf("text %q while invisible: got changed=%v %s self_only=%v self=%v self_text=%q; want a change only the user sees, above v%d",
				text, ch.Changed, gotEv(e), e.SelfOnly, e.Self, e.SelfText, last.Version)
		}
		last = e
		other(fmt.Sprintf("after %q", text), now, text, e.Version)
	}
	h.wantNone("the same text again", h.status(vanished+4*sec, "u", presence.ManualInvisible, "back at 3"))
	h.wantNone("a beat", h.beat(vanished+5*sec, "u", "d", true))
	// Checkpointed: the public face goes with the profile, and a store
	// that loads it shows the same.
	var p presence.Profile
	for _, d := range h.dirty() {
		if d.UserID == "u" {
			p = d
		}
	}
	if text, v := p.Public(); text != "lunch" || v != gone.Version || p.Text != "back at 3" || p.Version != last.Version {
		t.Errorf("checkpoint: public %q v%d, own %q v%d; want %q v%d and %q v%d", text, v, p.Text, p.Version, "lunch", gone.Version, "back at 3", last.Version)
	}
	p.UserID = "copy"
	h.load(vanished+6*sec, p)
	if s := h.get(vanished+6*sec, "copy"); privacy.Filter(privacy.Relation{}, &s).Text != "lunch" || s.Text != "back at 3" {
		t.Errorf("loaded from the checkpoint: others read %q, the user %q; want %q and %q",
			privacy.Filter(privacy.Relation{}, &s).Text, s.Text, "lunch", "back at 3")
	}
	// The devices die, the user comes back still invisible: still frozen.
	h.wantNoEvents("expire", h.expire(vanished+5*sec+h.ttl()))
	h.wantNone("back, invisible", h.beat(vanished+time.Hour.Milliseconds(), "u", "d", true))
	other("back, invisible", vanished+time.Hour.Milliseconds(), "back at 3", last.Version)
	// Visible again: everyone sees the text now, at a version above all.
	back := vanished + time.Hour.Milliseconds() + sec
	e := h.wantEvent("visible", h.status(back, "u", presence.ManualNone, "back at 3"),
		ev{user: "u", prev: presence.Offline, status: presence.Online, text: "back at 3", lastSeen: back})
	if e.Version <= last.Version || e.SelfOnly {
		t.Errorf("visible again at version %d (self only %v), want above %d", e.Version, e.SelfOnly, last.Version)
	}
	if s := h.get(back, "u"); privacy.Filter(privacy.Relation{}, &s).Version != e.Version {
		t.Errorf("visible again: others read version %d, want %d", privacy.Filter(privacy.Relation{}, &s).Version, e.Version)
	}
}

// testInvisibleFromTheStart: a user invisible before anyone ever saw them
// (a backend that provisions its users invisible, a user who set it
// before their first heartbeat, a profile loaded so) has a public face
// all the same: the text they set is theirs alone, everyone else reads an
// offline user without it — in events, reads, and what is checkpointed
// for later reads — and the heartbeats that follow show nothing.
func testInvisibleFromTheStart(t *testing.T, f Factory) {
	for _, tc := range []struct {
		name    string
		profile presence.Profile
	}{
		{"set invisible", presence.Profile{UserID: "u"}},
		{"loaded invisible", presence.Profile{UserID: "u", Manual: presence.ManualInvisible}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newH(t, f, DefaultRules)
			h.load(t0, tc.profile)
			h.wantNone("invisible", h.status(t0, "u", presence.ManualInvisible, ""))
			h.wantNone("a beat", h.beat(t0+sec, "u", "d", true))
			s := h.get(t0+sec, "u")
			before := privacy.Filter(privacy.Relation{}, &s)
			last := before.Version
			for i, text := range []string{"at the doctor", "still there"} {
				now := t0 + int64(2+i)*sec
				ch := h.status(now, "u", presence.ManualInvisible, text)
				e := ch.Event
				if !ch.Changed || !e.SelfOnly || e.Status != presence.Offline || e.Text != "" || e.SelfText != text || e.Version <= last {
					t.Fatalf("text %q: got changed=%v %s self_only=%v self_text=%q; want a change only the user sees, above v%d",
						text, ch.Changed, gotEv(e), ch.Event.SelfOnly, e.SelfText, last)
				}
				last = e.Version
				s := h.get(now, "u")
				if v := privacy.Filter(privacy.Relation{}, &s); v.Status != presence.Offline || v.Text != "" || v.Version < before.Version || v.Version >= e.Version {
					t.Errorf("text %q: another viewer reads %+v, want offline without a text, at a version in [%d, %d)", text, v, before.Version, e.Version)
				}
				if v := privacy.Filter(privacy.Relation{Self: true}, &s); v.Text != text || v.Version != e.Version {
					t.Errorf("text %q: the user reads %q at %d, want %q at %d", text, v.Text, v.Version, text, e.Version)
				}
				h.wantNone("a beat after the text", h.beat(now+sec/2, "u", "d", true))
			}
			var p presence.Profile
			for _, d := range h.dirty() {
				if d.UserID == "u" {
					p = d
				}
			}
			if text, v := p.Public(); text != "" || v >= last || p.Text != "still there" || p.Version != last {
				t.Errorf("checkpoint: public %q v%d, own %q v%d; want no text below v%d, and %q v%d", text, v, p.Text, p.Version, last, "still there", last)
			}
			p.UserID = "copy"
			h.load(t0+5*sec, p)
			if s := h.get(t0+5*sec, "copy"); privacy.Filter(privacy.Relation{}, &s).Text != "" || s.Text != "still there" {
				t.Errorf("loaded from the checkpoint: others read %q, the user %q; want none and %q",
					privacy.Filter(privacy.Relation{}, &s).Text, s.Text, "still there")
			}
			h.wantNoEvents("the device dies", h.expire(t0+5*sec+h.ttl()))
		})
	}
}

// testLoadFaceAboveVersion: a profile whose public version is above its
// version (no store writes one) is loaded with the public version as its
// version: the user never reads a version below what others read, and
// the next change is above both.
func testLoadFaceAboveVersion(t *testing.T, f Factory) {
	h := newH(t, f, DefaultRules)
	h.load(t0, presence.Profile{UserID: "u", Text: "lunch", Version: 10, PubText: "lunch", PubVersion: 12})
	s := h.get(t0, "u")
	self, other := privacy.Filter(privacy.Relation{Self: true}, &s), privacy.Filter(privacy.Relation{}, &s)
	if self.Version < 12 || other.Version != self.Version {
		t.Errorf("loaded: the user reads version %d, others %d; want both the same, at 12 at least", self.Version, other.Version)
	}
	e := h.wantEvent("online", h.beat(t0+sec, "u", "d", true), ev{user: "u", prev: presence.Offline, status: presence.Online, text: "lunch"})
	if e.Version <= max(self.Version, other.Version) {
		t.Errorf("the next change at version %d, want above %d", e.Version, max(self.Version, other.Version))
	}
}
