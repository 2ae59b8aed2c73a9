package fanout_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/wire"
)

// frame is one delivery as a sink saw it.
type frame struct {
	user    string
	version uint64
	b       []byte
}

// sink is a Sink that records what it is given. With gate set, the
// delivery of gateVersion blocks until gate is closed, after closing
// reached (a sink must not block; this one does to hold Run mid-batch).
type sink struct {
	viewer string

	mu  sync.Mutex
	got []frame

	gateVersion uint64
	gate        chan struct{}
	reached     chan struct{}
}

func newSink(viewer string) *sink { return &sink{viewer: viewer} }

func (s *sink) Viewer() string { return s.viewer }

func (s *sink) Deliver(user string, version uint64, b []byte) {
	s.mu.Lock()
	s.got = append(s.got, frame{user, version, b})
	s.mu.Unlock()
	if s.gate != nil && version == s.gateVersion {
		close(s.reached)
		<-s.gate
	}
}

func (s *sink) frames() []frame {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]frame(nil), s.got...)
}

func (s *sink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got)
}

// rels is an in-memory Relations. A hook runs once inside the next
// ListedBy, after it has read the lists and before it answers: the answer
// is what the lists were when it read them.
type rels struct {
	mu    sync.Mutex
	lists map[string]map[string]bool // owner → contacts
	hook  func()
	err   error
	calls int
}

func newRels() *rels { return &rels{lists: map[string]map[string]bool{}} }

func (r *rels) set(owner string, contacts ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := map[string]bool{}
	for _, c := range contacts {
		m[c] = true
	}
	r.lists[owner] = m
}

func (r *rels) ListedBy(ctx context.Context, viewer string, owners []string, fn func(string)) error {
	r.mu.Lock()
	r.calls++
	hook, err := r.hook, r.err
	r.hook = nil
	var listed []string
	for _, o := range owners {
		if r.lists[o][viewer] {
			listed = append(listed, o)
		}
	}
	r.mu.Unlock()
	if hook != nil {
		hook()
	}
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, o := range listed {
		fn(o)
	}
	return nil
}

func newHub(t testing.TB, r fanout.Relations, cfg fanout.Config) *fanout.Hub {
	t.Helper()
	cfg.Relations = r
	h, err := fanout.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func subscribe(t testing.TB, h *fanout.Hub, s fanout.Sink, ids ...string) []string {
	t.Helper()
	added, err := h.Subscribe(context.Background(), s, ids)
	if err != nil {
		t.Fatalf("Subscribe(%s, %d ids): %v", s.Viewer(), len(ids), err)
	}
	return added
}

const ms = int64(1795388929123)

func event(user string, st presence.Status, version uint64, set presence.Settings) *presence.Event {
	return &presence.Event{UserID: user, Status: st, Prev: presence.Offline, Text: "hi",
		LastSeen: ms, Version: version, At: ms, Settings: set}
}

// decoded is a presence message as a client reads it.
type decoded struct {
	Type       string  `json:"type"`
	UserID     string  `json:"user_id"`
	Status     *string `json:"status"`
	LastSeen   *string `json:"last_seen"`
	StatusText *string `json:"status_text"`
	Version    *uint64 `json:"version"`
}

func decode(t *testing.T, b []byte) decoded {
	t.Helper()
	if !json.Valid(b) {
		t.Fatalf("frame is not valid JSON: %s", b)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	var m decoded
	if err := d.Decode(&m); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	return m
}

// allows is the test's own reading of the privacy rules.
func allows(v presence.Visibility, self, contact bool) bool {
	switch v {
	case presence.Everyone:
		return true
	case presence.Contacts:
		return self || contact
	}
	return self
}

func TestNewConfig(t *testing.T) {
	if _, err := fanout.New(fanout.Config{}); err == nil {
		t.Error("New without Relations: want an error")
	}
	if _, err := fanout.New(fanout.Config{Relations: newRels(), MaxSubscriptions: -1}); err == nil {
		t.Error("New with a negative cap: want an error")
	}
}

// TestPrivacyMatrix: every (status, last_seen) visibility × (contact,
// non-contact, self) watcher gets exactly what the rules allow, and nothing
// at all when the status is hidden from them.
func TestPrivacyMatrix(t *testing.T) {
	vis := []presence.Visibility{presence.Everyone, presence.Contacts, presence.Nobody}
	watchers := []struct {
		viewer        string
		self, contact bool
	}{
		{"target", true, false},
		{"friend", false, true},
		{"stranger", false, false},
	}
	for _, sv := range vis {
		for _, lv := range vis {
			for _, st := range []presence.Status{presence.Online, presence.Offline} {
				set := presence.Settings{Status: sv, LastSeen: lv}
				t.Run(fmt.Sprintf("status=%v/last_seen=%v/%v", sv, lv, st), func(t *testing.T) {
					r := newRels()
					r.set("target", "friend")
					h := newHub(t, r, fanout.Config{})
					sinks := map[string]*sink{}
					for _, w := range watchers {
						s := newSink(w.viewer)
						sinks[w.viewer] = s
						subscribe(t, h, s, "target")
					}
					h.Publish(event("target", st, 7, set))
					for _, w := range watchers {
						got := sinks[w.viewer].frames()
						wantStatus := allows(sv, w.self, w.contact)
						if !wantStatus {
							if len(got) != 0 {
								t.Errorf("%s: got %s, want nothing", w.viewer, got[0].b)
							}
							continue
						}
						if len(got) != 1 {
							t.Fatalf("%s: got %d frames, want 1", w.viewer, len(got))
						}
						f := got[0]
						m := decode(t, f.b)
						if f.user != "target" || f.version != 7 || m.Type != "presence" || m.UserID != "target" ||
							m.Version == nil || *m.Version != 7 {
							t.Errorf("%s: got %q v%d %s", w.viewer, f.user, f.version, f.b)
						}
						if m.Status == nil || *m.Status != st.String() {
							t.Errorf("%s: status in %s, want %v", w.viewer, f.b, st)
						}
						if m.StatusText == nil || *m.StatusText != "hi" {
							t.Errorf("%s: status_text in %s, want hi", w.viewer, f.b)
						}
						wantLast := allows(lv, w.self, w.contact)
						if (m.LastSeen != nil) != wantLast {
							t.Errorf("%s: last_seen in %s, want shown=%v", w.viewer, f.b, wantLast)
						}
						if wantLast && *m.LastSeen != wire.FormatTime(ms) {
							t.Errorf("%s: last_seen %s, want %s", w.viewer, *m.LastSeen, wire.FormatTime(ms))
						}
					}
					stats := h.Stats()
					n := 0
					for _, w := range watchers {
						if allows(sv, w.self, w.contact) {
							n++
						}
					}
					if stats.Delivered != uint64(n) || stats.SkippedPrivacy != uint64(3-n) {
						t.Errorf("stats %+v: want %d delivered, %d skipped", stats, n, 3-n)
					}
				})
			}
		}
	}
}

// TestInvisibleLooksLikeBye: going invisible and logging out at the same
// moment reach every watcher as the same bytes (but the user id).
func TestInvisibleLooksLikeBye(t *testing.T) {
	rules := &presence.Rules{TTL: 30 * time.Second, IdleAfter: 5 * time.Minute}
	for _, set := range []presence.Settings{{}, {Status: presence.Contacts, LastSeen: presence.Contacts}, {LastSeen: presence.Nobody}} {
		inv := presence.NewUser(presence.Profile{UserID: "a", Settings: set})
		bye := presence.NewUser(presence.Profile{UserID: "b", Settings: set})
		for _, u := range []*presence.User{inv, bye} {
			if _, err := u.Beat(rules, ms, "phone", true); err != nil {
				t.Fatal(err)
			}
		}
		chInv := inv.SetStatus(rules, ms+5000, presence.ManualInvisible, "")
		chBye := bye.Bye(rules, ms+5000, "phone")
		if !chInv.Changed || !chBye.Changed {
			t.Fatalf("no events: %+v %+v", chInv, chBye)
		}
		r := newRels()
		r.set("a", "friend")
		r.set("b", "friend")
		h := newHub(t, r, fanout.Config{})
		var sinks []*sink
		for _, v := range []string{"friend", "stranger"} {
			s := newSink(v)
			subscribe(t, h, s, "a", "b")
			sinks = append(sinks, s)
		}
		h.Publish(&chInv.Event)
		h.Publish(&chBye.Event)
		for _, s := range sinks {
			got := s.frames()
			if len(got) == 0 {
				continue // hidden from this watcher: equally hidden for both
			}
			if len(got) != 2 {
				t.Fatalf("%+v %s: got %d frames, want 2", set, s.viewer, len(got))
			}
			a := strings.Replace(string(got[0].b), `"user_id":"a"`, `"user_id":"b"`, 1)
			if a != string(got[1].b) || got[0].version != got[1].version {
				t.Errorf("%+v %s: invisible reads\n%s\nbye reads\n%s", set, s.viewer, got[0].b, got[1].b)
			}
			if m := decode(t, got[0].b); m.Status == nil || *m.Status != "offline" {
				t.Errorf("invisible reads %s", got[0].b)
			}
		}
	}
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

func TestSubscribeCap(t *testing.T) {
	h := newHub(t, newRels(), fanout.Config{})
	s := newSink("v")
	if _, err := h.Subscribe(context.Background(), s, ids("u", 501)); !errors.Is(err, fanout.ErrTooManySubscriptions) {
		t.Fatalf("501 at once: %v, want ErrTooManySubscriptions", err)
	}
	if st := h.Stats(); st.Subscriptions != 0 || st.Targets != 0 {
		t.Fatalf("after a refused request: %+v, want nothing added", st)
	}
	if added := subscribe(t, h, s, ids("u", 499)...); len(added) != 499 {
		t.Fatalf("added %d, want 499", len(added))
	}
	// Already watched ids do not count; duplicates count once.
	added := subscribe(t, h, s, "u0", "u1", "x", "x", "u2")
	if strings.Join(added, ",") != "x" {
		t.Fatalf("added %q, want [x]", added)
	}
	// 500 now: one more is refused, with the rest of its request.
	if _, err := h.Subscribe(context.Background(), s, []string{"u3", "y", "z"}); !errors.Is(err, fanout.ErrTooManySubscriptions) {
		t.Fatalf("501st: %v, want ErrTooManySubscriptions", err)
	}
	if added := subscribe(t, h, s, "u3", "u4"); len(added) != 0 {
		t.Fatalf("re-subscribing watched ids at the cap added %q", added)
	}
	if st := h.Stats(); st.Subscriptions != 500 || st.Refused != 2 {
		t.Fatalf("stats %+v: want 500 subscriptions, 2 refused", st)
	}
	h.Publish(event("y", presence.Online, 1, presence.Settings{}))
	if s.count() != 0 {
		t.Fatal("a refused id was watched")
	}
	// After unsubscribing one, one fits again.
	h.Unsubscribe(s, []string{"u0"})
	if added := subscribe(t, h, s, "y"); len(added) != 1 {
		t.Fatalf("added %q, want [y]", added)
	}
	// The cap is per sink.
	if added := subscribe(t, h, newSink("v"), ids("u", 500)...); len(added) != 500 {
		t.Fatalf("another sink: added %d, want 500", len(added))
	}
}

// TestSubscribeCapConcurrent: concurrent Subscribes on one sink never take
// it past the cap.
func TestSubscribeCapConcurrent(t *testing.T) {
	h := newHub(t, newRels(), fanout.Config{})
	s := newSink("v")
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, refused := 0, 0
	for g := range 50 {
		wg.Go(func() {
			_, err := h.Subscribe(context.Background(), s, ids(fmt.Sprintf("g%d-", g), 20))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, fanout.ErrTooManySubscriptions):
				refused++
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if ok != 25 || refused != 25 || h.Stats().Subscriptions != 500 {
		t.Errorf("%d ok, %d refused, %d subscriptions; want 25, 25, 500", ok, refused, h.Stats().Subscriptions)
	}
}

func TestSubscribeRelationsError(t *testing.T) {
	r := newRels()
	r.err = errors.New("db down")
	h := newHub(t, r, fanout.Config{})
	s := newSink("v")
	if _, err := h.Subscribe(context.Background(), s, []string{"a", "b"}); err == nil {
		t.Fatal("want the Relations error")
	}
	if st := h.Stats(); st.Subscriptions != 0 {
		t.Fatalf("stats %+v: want nothing added", st)
	}
	// Watching only oneself needs no look-up.
	r.err = nil
	calls := r.calls
	subscribe(t, h, newSink("me"), "me")
	if r.calls != calls {
		t.Error("Relations asked about the viewer themselves")
	}
}

func TestUnsubscribeAndRemove(t *testing.T) {
	h := newHub(t, newRels(), fanout.Config{})
	a, b := newSink("a"), newSink("b")
	subscribe(t, h, a, "x", "y")
	subscribe(t, h, b, "x")
	h.Unsubscribe(a, []string{"x", "never"})
	h.Publish(event("x", presence.Online, 1, presence.Settings{}))
	h.Publish(event("y", presence.Online, 1, presence.Settings{}))
	if got := a.frames(); len(got) != 1 || got[0].user != "y" {
		t.Fatalf("a got %v, want only y", got)
	}
	if b.count() != 1 {
		t.Fatalf("b got %d, want 1", b.count())
	}
	h.Remove(a)
	h.Remove(a) // idempotent
	h.Publish(event("y", presence.Away, 2, presence.Settings{}))
	if a.count() != 1 {
		t.Fatalf("a got frames after Remove")
	}
	h.Remove(b)
	if st := h.Stats(); st.Sinks != 0 || st.Subscriptions != 0 || st.Targets != 0 {
		t.Fatalf("stats after removing all: %+v", st)
	}
	h.Unsubscribe(newSink("ghost"), []string{"x"}) // unknown sink: no-op
}

func TestContactsChanged(t *testing.T) {
	set := presence.Settings{Status: presence.Contacts, LastSeen: presence.Contacts}
	r := newRels()
	h := newHub(t, r, fanout.Config{})
	f, me := newSink("f"), newSink("t")
	subscribe(t, h, f, "t")
	subscribe(t, h, me, "t")
	h.Publish(event("t", presence.Online, 1, set))
	if f.count() != 0 || me.count() != 1 {
		t.Fatalf("before: f %d, self %d; want 0, 1", f.count(), me.count())
	}
	r.set("t", "f")
	h.ContactsChanged(context.Background(), "t", []string{"f"}, nil) // grant
	h.Publish(event("t", presence.Away, 2, set))
	if f.count() != 1 || me.count() != 2 {
		t.Fatalf("after grant: f %d, self %d; want 1, 2", f.count(), me.count())
	}
	r.set("t")
	h.ContactsChanged(context.Background(), "t", nil, nil) // revoke; self stays self
	h.Publish(event("t", presence.Online, 3, set))
	if f.count() != 1 || me.count() != 3 {
		t.Fatalf("after revoke: f %d, self %d; want 1, 3", f.count(), me.count())
	}
	h.ContactsChanged(context.Background(), "nobody-watches", []string{"f"}, nil)
}

// TestContactsChangedDuringSubscribe: a contact list that changes while
// Subscribe reads the relations is read again; a revocation is never lost.
func TestContactsChangedDuringSubscribe(t *testing.T) {
	set := presence.Settings{Status: presence.Contacts}
	for _, tc := range []struct {
		name       string
		before     []string
		after      []string
		wantFrames int
	}{
		{"revoked", []string{"f"}, nil, 0},
		{"granted", nil, []string{"f"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRels()
			r.set("t", tc.before...)
			h := newHub(t, r, fanout.Config{})
			other := newSink("o")
			subscribe(t, h, other, "t") // so that "t" is watched already
			r.hook = func() {
				r.set("t", tc.after...)
				h.ContactsChanged(context.Background(), "t", tc.after, nil)
			}
			f := newSink("f")
			subscribe(t, h, f, "t", "u")
			h.Publish(event("t", presence.Online, 1, set))
			if f.count() != tc.wantFrames {
				t.Errorf("got %d frames, want %d", f.count(), tc.wantFrames)
			}
			if st := h.Stats(); st.RelationRetries == 0 {
				t.Errorf("stats %+v: want a relation retry", st)
			}
		})
	}
}

// TestEncodeOnce: sinks of one view share the very same bytes; distinct
// views are encoded once each.
func TestEncodeOnce(t *testing.T) {
	r := newRels()
	r.set("t", "c1", "c2")
	h := newHub(t, r, fanout.Config{})
	var others, contacts []*sink
	for i := range 3 {
		s := newSink(fmt.Sprintf("o%d", i))
		subscribe(t, h, s, "t")
		others = append(others, s)
	}
	for _, v := range []string{"c1", "c2", "t"} {
		s := newSink(v)
		subscribe(t, h, s, "t")
		contacts = append(contacts, s)
	}
	h.Publish(event("t", presence.Online, 9, presence.Settings{LastSeen: presence.Contacts}))
	first := func(s *sink) []byte { return s.frames()[0].b }
	for _, group := range [][]*sink{others, contacts} {
		for _, s := range group[1:] {
			if &first(s)[0] != &first(group[0])[0] {
				t.Errorf("%s and %s got different copies of one view", s.viewer, group[0].viewer)
			}
		}
	}
	if bytes.Equal(first(others[0]), first(contacts[0])) {
		t.Error("contacts and others got the same view")
	}
	if st := h.Stats(); st.Frames != 2 {
		t.Errorf("encoded %d frames, want 2", st.Frames)
	}
	// A sink appending to its frame cannot touch another view's bytes.
	f := first(others[0])
	if cap(f) != len(f) {
		t.Errorf("frame has spare capacity %d", cap(f)-len(f))
	}
}

func TestPublishAllocs(t *testing.T) {
	h := newHub(t, newRels(), fanout.Config{})
	for i := range 500 {
		subscribe(t, h, &countSink{viewer: fmt.Sprint("v", i)}, "t")
	}
	ev := event("t", presence.Online, 1, presence.Settings{})
	allocs := testing.AllocsPerRun(100, func() {
		ev.Version++
		ev.Status = presence.Online + presence.Status(ev.Version%2)
		h.Publish(ev)
	})
	if allocs > 1 {
		t.Errorf("Publish to 500 watchers: %v allocations, want at most 1 (the frame)", allocs)
	}
}

// countSink counts deliveries without keeping them.
type countSink struct {
	viewer string
	mu     sync.Mutex
	n      int
	last   uint64
}

func (s *countSink) Viewer() string { return s.viewer }

func (s *countSink) Deliver(_ string, v uint64, _ []byte) {
	s.mu.Lock()
	s.n++
	s.last = v
	s.mu.Unlock()
}

// TestConcurrency: many sinks subscribing, unsubscribing, removing and
// changing contacts while events are published; run under -race.
func TestConcurrency(t *testing.T) {
	r := newRels()
	h := newHub(t, r, fanout.Config{AsyncThreshold: 5, AsyncBatch: 3})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = h.Run(ctx) })
	targets := ids("t", 30)
	var workers sync.WaitGroup
	for g := range 16 {
		workers.Go(func() {
			for round := range 50 {
				s := newSink(fmt.Sprintf("v%d", (g+round)%10))
				if _, err := h.Subscribe(ctx, s, targets[g%7:g%7+20]); err != nil {
					t.Error(err)
				}
				h.Unsubscribe(s, targets[g%7:g%7+5])
				if round%3 == 0 {
					r.set(targets[round%30], fmt.Sprintf("v%d", round%10))
					h.ContactsChanged(context.Background(), targets[round%30], []string{fmt.Sprintf("v%d", round%10)}, nil)
				}
				h.Remove(s)
			}
		})
	}
	for g := range 4 {
		workers.Go(func() {
			for v := range 500 {
				h.Publish(event(targets[(g*7+v)%30], presence.Status(1+v%3), uint64(v+1), presence.Settings{Status: presence.Contacts}))
			}
		})
	}
	workers.Wait()
	cancel()
	wg.Wait()
	if st := h.Stats(); st.Sinks != 0 || st.Subscriptions != 0 || st.Targets != 0 {
		t.Errorf("after everyone left: %+v", st)
	}
}

func runHub(t *testing.T, h *fanout.Hub) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// celebrity subscribes n sinks to "celeb" and returns them in slot order.
func celebrity(t *testing.T, h *fanout.Hub, n int) []*sink {
	var out []*sink
	for i := range n {
		s := newSink(fmt.Sprintf("fan%d", i))
		subscribe(t, h, s, "celeb")
		out = append(out, s)
	}
	return out
}

// TestAsyncCoalesces: events of a user above the threshold wait for Run,
// only the newest is delivered, and users below the threshold are
// delivered at once meanwhile.
func TestAsyncCoalesces(t *testing.T) {
	r := newRels()
	r.set("celeb", "fan1")
	h := newHub(t, r, fanout.Config{AsyncThreshold: 10, AsyncBatch: 3})
	fans := celebrity(t, h, 11)
	friend := newSink("fan0")
	subscribe(t, h, friend, "normal")
	set := presence.Settings{Status: presence.Contacts}
	for v := uint64(1); v <= 3; v++ {
		h.Publish(event("celeb", presence.Online, v, set))
	}
	h.Publish(event("celeb", presence.Away, 2, set)) // late and older: dropped
	h.Publish(event("normal", presence.Online, 1, presence.Settings{}))
	if friend.count() != 1 {
		t.Fatalf("normal user: %d frames, want 1 at once", friend.count())
	}
	for _, s := range fans {
		if s.count() != 0 {
			t.Fatalf("%s got a celebrity frame inside Publish", s.viewer)
		}
	}
	if st := h.Stats(); st.AsyncPending != 1 || st.AsyncQueued != 4 || st.AsyncCoalesced != 3 {
		t.Fatalf("stats %+v: want 1 pending, 4 queued, 3 coalesced", st)
	}
	runHub(t, h)
	testwait.For(t, "the celebrity's contact to get the event", func() bool { return fans[1].count() == 1 })
	testwait.For(t, "the queue to drain", func() bool { return h.Stats().AsyncPending == 0 })
	// Only the contact may see it (status: contacts), and only v3.
	for i, s := range fans {
		got := s.frames()
		switch {
		case i == 1 && (len(got) != 1 || got[0].version != 3):
			t.Errorf("contact got %v, want v3 once", got)
		case i != 1 && len(got) != 0:
			t.Errorf("%s got %d frames, want none (status hidden)", s.viewer, len(got))
		}
	}
}

// TestAsyncDoesNotDelayOthers: while Run is in the middle of delivering a
// celebrity's change (held there by a sink), a change of a normal user is
// delivered completely, and the celebrity's delivery then completes.
func TestAsyncDoesNotDelayOthers(t *testing.T) {
	h := newHub(t, newRels(), fanout.Config{AsyncThreshold: 100, AsyncBatch: 10})
	fans := celebrity(t, h, 1000)
	held := fans[500]
	held.gateVersion, held.gate, held.reached = 1, make(chan struct{}), make(chan struct{})
	var friends []*sink
	for i := range 50 {
		s := newSink(fmt.Sprint("friend", i))
		subscribe(t, h, s, "normal", "celeb")
		friends = append(friends, s)
	}
	runHub(t, h)
	h.Publish(event("celeb", presence.Online, 1, presence.Settings{}))
	<-held.reached // Run is mid-way through the celebrity
	h.Publish(event("normal", presence.Online, 1, presence.Settings{}))
	celebDone := 0
	for _, s := range fans {
		celebDone += s.count()
	}
	for _, s := range friends {
		if got := s.frames(); len(got) != 1 || got[0].user != "normal" {
			t.Fatalf("%s: got %v, want the normal user's change before the celebrity's", s.viewer, got)
		}
	}
	if celebDone == 0 || celebDone >= len(fans) {
		t.Fatalf("celebrity delivered to %d of %d when the normal user's change was: want mid-way", celebDone, len(fans))
	}
	close(held.gate)
	for _, s := range append(fans, friends...) {
		testwait.For(t, s.viewer+" to get the celebrity's change", func() bool {
			for _, f := range s.frames() {
				if f.user == "celeb" {
					return true
				}
			}
			return false
		})
	}
	if st := h.Stats(); st.AsyncBatches < 100 {
		t.Errorf("stats %+v: want the celebrity in batches of 10", st)
	}
}

// TestAsyncNewerEventMidway: a newer change taken while a celebrity's
// delivery is half done continues from there and wraps around: every
// watcher ends at the newest version, none waits for a second full pass.
func TestAsyncNewerEventMidway(t *testing.T) {
	h := newHub(t, newRels(), fanout.Config{AsyncThreshold: 50, AsyncBatch: 10})
	fans := celebrity(t, h, 100)
	held := fans[15]
	held.gateVersion, held.gate, held.reached = 1, make(chan struct{}), make(chan struct{})
	runHub(t, h)
	h.Publish(event("celeb", presence.Online, 1, presence.Settings{}))
	<-held.reached
	h.Publish(event("celeb", presence.Away, 2, presence.Settings{}))
	close(held.gate)
	for _, s := range fans {
		testwait.For(t, s.viewer+" to get v2", func() bool {
			got := s.frames()
			return len(got) > 0 && got[len(got)-1].version == 2
		})
	}
	onlyNewest := 0
	for i, s := range fans {
		got := s.frames()
		switch {
		case len(got) == 1 && got[0].version == 2:
			onlyNewest++
		case len(got) == 2 && got[0].version == 1 && got[1].version == 2:
			if i >= 20 {
				t.Errorf("fan %d (after the batch in flight) got v1 too", i)
			}
		default:
			t.Errorf("fan %d got %v", i, got)
		}
	}
	if onlyNewest != 80 {
		t.Errorf("%d fans got only v2, want the 80 after the batch in flight", onlyNewest)
	}
}

// TestAsyncUnsubscribeMidway: watchers leaving and joining while a
// celebrity is delivered in batches neither miss the change nor get it
// after they left.
func TestAsyncUnsubscribeMidway(t *testing.T) {
	h := newHub(t, newRels(), fanout.Config{AsyncThreshold: 50, AsyncBatch: 10})
	fans := celebrity(t, h, 200)
	held := fans[100]
	held.gateVersion, held.gate, held.reached = 1, make(chan struct{}), make(chan struct{})
	runHub(t, h)
	h.Publish(event("celeb", presence.Online, 1, presence.Settings{}))
	<-held.reached
	// Run holds a read lock; leave from other goroutines.
	left := make(chan struct{})
	go func() {
		defer close(left)
		for i := 0; i < 200; i += 2 {
			if i != 100 {
				h.Remove(fans[i])
			}
		}
	}()
	close(held.gate)
	<-left
	for i := 1; i < 200; i += 2 {
		s := fans[i]
		testwait.For(t, s.viewer, func() bool { return s.count() == 1 })
	}
	for i := 0; i < 100; i += 2 {
		if fans[i].count() != 1 {
			t.Errorf("fan %d (before the held one) got %d frames", i, fans[i].count())
		}
	}
	for i := 102; i < 200; i += 2 {
		if fans[i].count() > 1 {
			t.Errorf("fan %d got %d frames", i, fans[i].count())
		}
	}
	// The next change reaches everyone still there.
	h.Publish(event("celeb", presence.Away, 2, presence.Settings{}))
	for i := 1; i < 200; i += 2 {
		s := fans[i]
		testwait.For(t, s.viewer+" v2", func() bool { return s.count() == 2 })
	}
}

func TestRunTwice(t *testing.T) {
	h := newHub(t, newRels(), fanout.Config{AsyncThreshold: 1})
	fans := celebrity(t, h, 2)
	runHub(t, h)
	h.Publish(event("celeb", presence.Online, 1, presence.Settings{}))
	testwait.For(t, "Run to deliver", func() bool { return fans[1].count() == 1 })
	if err := h.Run(context.Background()); err == nil {
		t.Fatal("a second Run: want an error")
	}
}

// BenchmarkPublish500Watchers: one event to 500 watchers, two views; the
// status alternates, so every watcher is sent every event.
func BenchmarkPublish500Watchers(b *testing.B) {
	r := newRels()
	contacts := ids("v", 100)
	r.set("t", contacts...)
	h := newHub(b, r, fanout.Config{})
	for i := range 500 {
		subscribe(b, h, &countSink{viewer: fmt.Sprint("v", i)}, "t")
	}
	ev := event("t", presence.Online, 1, presence.Settings{LastSeen: presence.Contacts})
	b.ReportAllocs()
	for b.Loop() {
		ev.Version++
		ev.Status = presence.Online + presence.Status(ev.Version%2)
		h.Publish(ev)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/500, "ns/watcher")
}

// BenchmarkPublishParallel: events of many users published at once.
func BenchmarkPublishParallel(b *testing.B) {
	h := newHub(b, newRels(), fanout.Config{})
	users := ids("t", 1020)
	for i := range 2000 {
		subscribe(b, h, &countSink{viewer: fmt.Sprint("v", i)}, users[i%1000:i%1000+20]...)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ev := event("", presence.Online, 1, presence.Settings{})
		i := 0
		for pb.Next() {
			ev.UserID = users[i%1000]
			ev.Version++
			ev.Status = presence.Online + presence.Status(ev.Version%2)
			i += 7
			h.Publish(ev)
		}
	})
}

// TestAsyncThresholdBoundary: a user with exactly AsyncThreshold watchers
// is delivered inside Publish; one more watcher moves it to Run.
func TestAsyncThresholdBoundary(t *testing.T) {
	for _, tc := range []struct {
		watchers int
		inline   bool
	}{{5, true}, {6, false}} {
		h := newHub(t, newRels(), fanout.Config{AsyncThreshold: 5})
		fans := celebrity(t, h, tc.watchers)
		h.Publish(event("celeb", presence.Online, 1, presence.Settings{}))
		if got := fans[0].count() == 1; got != tc.inline {
			t.Errorf("%d watchers: delivered inside Publish = %v, want %v", tc.watchers, got, tc.inline)
		}
		if tc.inline {
			continue
		}
		runHub(t, h)
		for _, s := range fans {
			testwait.For(t, s.viewer, func() bool { return s.count() == 1 })
			if m := decode(t, s.frames()[0].b); m.Status == nil || *m.Status != "online" {
				t.Errorf("%s got %s", s.viewer, s.frames()[0].b)
			}
		}
	}
}

// interest records what the hub says about the users it watches.
type interest struct {
	mu      sync.Mutex
	watched map[string]int // Watch − Unwatch calls per user
	log     []string
}

func (in *interest) Watch(users []string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, u := range users {
		in.watched[u]++
		in.log = append(in.log, "+"+u)
	}
}

func (in *interest) Unwatch(users []string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, u := range users {
		in.watched[u]--
		in.log = append(in.log, "-"+u)
	}
}

func TestInterestFirstAndLastWatcher(t *testing.T) {
	in := &interest{watched: map[string]int{}}
	h := newHub(t, newRels(), fanout.Config{Interest: in})
	a, b := newSink("a"), newSink("b")

	subscribe(t, h, a, "x", "y", "a")
	if !h.Watched("x") || !h.Watched("a") || h.Watched("z") {
		t.Fatal("Watched disagrees with the subscriptions")
	}
	subscribe(t, h, b, "x", "z")
	h.Unsubscribe(a, []string{"x", "nobody"})
	if !h.Watched("x") {
		t.Fatal("x is still watched by b")
	}
	h.Remove(b)
	if h.Watched("x") || h.Watched("z") || !h.Watched("y") {
		t.Fatal("Watched after Remove")
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	want := map[string]int{"x": 0, "y": 1, "a": 1, "z": 0}
	for u, n := range want {
		if in.watched[u] != n {
			t.Errorf("user %s: Watch−Unwatch = %d, want %d (log %v)", u, in.watched[u], n, in.log)
		}
	}
	// x: first watcher a, then b joined (no call), a left (no call), b left.
	var xs []string
	for _, e := range in.log {
		if e[1:] == "x" {
			xs = append(xs, e)
		}
	}
	if fmt.Sprint(xs) != "[+x -x]" {
		t.Errorf("calls for x = %v, want [+x -x]", xs)
	}
}

// A bus built after the hub registers with SetInterest and hears of the
// first and last watchers as one given in the Config does.
func TestSetInterest(t *testing.T) {
	h := newHub(t, newRels(), fanout.Config{})
	in := &interest{watched: map[string]int{}}
	h.SetInterest(in)
	a := newSink("a")
	subscribe(t, h, a, "x")
	h.Remove(a)
	in.mu.Lock()
	defer in.mu.Unlock()
	if fmt.Sprint(in.log) != "[+x -x]" {
		t.Errorf("calls = %v, want [+x -x]", in.log)
	}
}

// Concurrent subscribers coming and going: at the end every user has had
// as many Watch as Unwatch calls and nobody is watched.
func TestInterestConcurrent(t *testing.T) {
	in := &interest{watched: map[string]int{}}
	h := newHub(t, newRels(), fanout.Config{Interest: in})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			s := newSink(fmt.Sprint("v", g))
			for i := range 200 {
				ids := []string{fmt.Sprint("u", i%5), fmt.Sprint("u", (i+g)%7)}
				if _, err := h.Subscribe(context.Background(), s, ids); err != nil {
					t.Error(err)
					return
				}
				h.Unsubscribe(s, ids[:1])
				if i%3 == 0 {
					h.Remove(s)
					s = newSink(fmt.Sprint("v", g))
				}
			}
			h.Remove(s)
		})
	}
	wg.Wait()
	in.mu.Lock()
	defer in.mu.Unlock()
	for u, n := range in.watched {
		if n != 0 || h.Watched(u) {
			t.Errorf("user %s: Watch−Unwatch = %d, watched %v", u, n, h.Watched(u))
		}
	}
}

// Resync sends each sink the state it may see of the users it watches, and
// nothing of users whose status it may not see or no longer watches.
func TestResync(t *testing.T) {
	h := newHub(t, newRels(), fanout.Config{})
	a, b := newSink("a"), newSink("b")
	subscribe(t, h, a, "x", "hidden")
	subscribe(t, h, b, "x", "y")
	h.Unsubscribe(b, []string{"y"})
	gone := newSink("c")
	subscribe(t, h, gone, "x")
	h.Remove(gone)

	read := func(_ context.Context, viewer string, ids []string, out []privacy.View) error {
		for i, id := range ids {
			out[i] = privacy.View{UserID: id}
			if id != "hidden" {
				out[i] = privacy.View{UserID: id, StatusVisible: true, Status: presence.Busy, Version: 7}
			}
		}
		return nil
	}
	if err := h.Resync(context.Background(), read); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*sink{a, b} {
		fs := s.frames()
		if len(fs) != 1 || fs[0].user != "x" || fs[0].version != 7 {
			t.Fatalf("%s got %+v, want one frame of x at version 7", s.viewer, fs)
		}
		if d := decode(t, fs[0].b); d.Status == nil || *d.Status != "busy" {
			t.Errorf("%s: frame %s", s.viewer, fs[0].b)
		}
	}
	if gone.count() != 0 {
		t.Errorf("a removed sink got %d frames", gone.count())
	}
	if got := h.Stats().Resynced; got != 2 {
		t.Errorf("Resynced = %d, want 2", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := h.Resync(ctx, read); err == nil {
		t.Error("Resync with a canceled context: no error")
	}
}

// blockingInterest holds every Watch call until release is closed.
type blockingInterest struct {
	entered chan string
	release chan struct{}
}

func (in *blockingInterest) Watch(users []string) {
	for _, u := range users {
		in.entered <- u
	}
	<-in.release
}

func (in *blockingInterest) Unwatch([]string) {}

// A second watcher of a user whose first watcher is still telling the
// Interest (the bus subscribing) must not return from Subscribe before
// that call did: its caller reads the snapshot next, and a change made
// before the bus has the subscription would reach neither the snapshot
// nor the watcher.
func TestSubscribeWaitsForTheFirstWatchersInterest(t *testing.T) {
	in := &blockingInterest{entered: make(chan string, 10), release: make(chan struct{})}
	h := newHub(t, newRels(), fanout.Config{Interest: in})
	a, b := newSink("a"), newSink("b")
	aDone := make(chan error, 1)
	go func() {
		_, err := h.Subscribe(context.Background(), a, []string{"x"})
		aDone <- err
	}()
	if u := <-in.entered; u != "x" {
		t.Fatalf("Watch(%s), want x", u)
	}
	bDone := make(chan error, 1)
	go func() {
		_, err := h.Subscribe(context.Background(), b, []string{"x"})
		bDone <- err
	}()
	select {
	case err := <-bDone:
		t.Fatalf("second Subscribe of x returned (err %v) while the first watcher's Watch was still running", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(in.release)
	for _, c := range []chan error{aDone, bDone} {
		select {
		case err := <-c:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Subscribe did not return after Watch did")
		}
	}
	// A later watcher does not wait for anything.
	c := newSink("c")
	subscribe(t, h, c, "x")

	// A waiting Subscribe gives up with its ctx, keeping the subscription.
	in.release = make(chan struct{})
	go func() { _, _ = h.Subscribe(context.Background(), a, []string{"y"}) }()
	<-in.entered
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := h.Subscribe(ctx, b, []string{"y"}); err != nil {
		t.Fatal(err)
	}
	close(in.release)
}

// A contact-list change that the hub was not told of (announced by another
// node while this one was cut off from the bus) is caught up by Resync: a
// watcher removed from the list stops receiving what only contacts see,
// one added starts; and if the relations cannot be read, the hub fails
// closed.
func TestResyncRereadsRelations(t *testing.T) {
	r := newRels()
	r.set("o", "w")
	h := newHub(t, r, fanout.Config{})
	w, v, self := newSink("w"), newSink("v"), newSink("o")
	subscribe(t, h, w, "o")
	subscribe(t, h, v, "o")
	subscribe(t, h, self, "o")
	contactsOnly := presence.Settings{Status: presence.Contacts, LastSeen: presence.Contacts}

	h.Publish(event("o", presence.Online, 1, contactsOnly))
	if w.count() != 1 || v.count() != 0 || self.count() != 1 {
		t.Fatalf("before: w %d, v %d, self %d frames, want 1, 0, 1", w.count(), v.count(), self.count())
	}

	r.set("o", "v") // missed: no h.ContactsChanged
	nothing := func(_ context.Context, _ string, ids []string, out []privacy.View) error {
		for i, id := range ids {
			out[i] = privacy.View{UserID: id}
		}
		return nil
	}
	if err := h.Resync(context.Background(), nothing); err != nil {
		t.Fatal(err)
	}
	h.Publish(event("o", presence.Busy, 2, contactsOnly))
	if w.count() != 1 {
		t.Errorf("w was removed from o's contacts and still got %+v", w.frames()[1:])
	}
	if v.count() != 1 || self.count() != 2 {
		t.Errorf("after: v %d, self %d frames, want 1, 2", v.count(), self.count())
	}

	r.set("o", "w", "v")
	r.mu.Lock()
	r.err = errors.New("durable store down")
	r.mu.Unlock()
	if err := h.Resync(context.Background(), nothing); err != nil {
		t.Fatal(err)
	}
	h.Publish(event("o", presence.Away, 3, contactsOnly))
	if w.count() != 1 || v.count() != 1 || self.count() != 3 {
		t.Errorf("relations unreadable: w %d, v %d, self %d frames, want 1, 1, 3 (fail closed)", w.count(), v.count(), self.count())
	}
}

// settingsEvent is a change of target's settings from before to after at
// version, its state as published last.
func settingsEvent(user string, version uint64, before, after presence.Settings) *presence.Event {
	ev := event(user, presence.Busy, version, after)
	ev.Self, ev.SettingsOnly, ev.SettingsChanged, ev.PrevSettings = presence.Busy, true, true, before
	return ev
}

// lastOf returns the status ("" for null) and version of s's last frame,
// and how many frames it got.
func lastOf(t *testing.T, s *sink) (status string, version uint64, n int) {
	t.Helper()
	got := s.frames()
	if len(got) == 0 {
		return "", 0, 0
	}
	m := decode(t, got[len(got)-1].b)
	if m.Version == nil {
		t.Fatalf("%s: frame without a version: %s", s.viewer, got[len(got)-1].b)
	}
	if m.Status != nil {
		status = *m.Status
	}
	return status, *m.Version, len(got)
}

// TestSettingsChangePushed: a change of settings reaches every watcher
// whose view changed — the status hidden, at the new version, for one who
// lost sight; the status for one who gained it — and nobody else.
func TestSettingsChangePushed(t *testing.T) {
	r := newRels()
	r.set("target", "friend")
	h := newHub(t, r, fanout.Config{})
	self, friend, stranger := newSink("target"), newSink("friend"), newSink("stranger")
	for _, s := range []*sink{self, friend, stranger} {
		subscribe(t, h, s, "target")
	}
	everyone, contacts, nobody := presence.Settings{}, presence.Settings{Status: presence.Contacts, LastSeen: presence.Contacts}, presence.Settings{Status: presence.Nobody, LastSeen: presence.Nobody}
	ev := event("target", presence.Busy, 1, everyone)
	ev.Self = presence.Busy
	h.Publish(ev)
	steps := []struct {
		name          string
		ev            *presence.Event
		self          int // frames after the step
		friend        string
		friendFrames  int
		stranger      string
		strangerCount int
	}{
		{"everyone→contacts", settingsEvent("target", 2, everyone, contacts), 1, "busy", 1, "", 2},
		{"contacts→contacts (a contact list changed)", settingsEvent("target", 3, contacts, contacts), 1, "busy", 1, "", 2},
		{"contacts→nobody", settingsEvent("target", 4, contacts, nobody), 1, "", 2, "", 2},
		{"nobody→everyone", settingsEvent("target", 5, nobody, everyone), 1, "busy", 3, "busy", 3},
		{"last_seen only: everyone→nobody", settingsEvent("target", 6, everyone, presence.Settings{LastSeen: presence.Nobody}), 1, "busy", 4, "busy", 4},
	}
	for _, st := range steps {
		h.Publish(st.ev)
		if _, _, n := lastOf(t, self); n != st.self {
			t.Errorf("%s: the user's own socket got %d frames, want %d (its view never depends on settings)", st.name, n, st.self)
		}
		status, v, n := lastOf(t, friend)
		if n != st.friendFrames || status != st.friend || (n > 1 && v != st.ev.Version && n != 1) {
			t.Errorf("%s: friend's last frame %q v%d (%d frames), want %q (%d frames)", st.name, status, v, n, st.friend, st.friendFrames)
		}
		status, v, n = lastOf(t, stranger)
		if n != st.strangerCount || status != st.stranger {
			t.Errorf("%s: stranger's last frame %q v%d (%d frames), want %q (%d frames)", st.name, status, v, n, st.stranger, st.strangerCount)
		}
	}
	// The frame of a lost sight: every field null but the version, which
	// is the change's (above everything the watcher was sent).
	got := stranger.frames()
	m := decode(t, got[1].b)
	if m.Status != nil || m.LastSeen != nil || m.StatusText != nil || m.Version == nil || *m.Version != 2 || got[1].version != 2 {
		t.Errorf("lost sight: %s (version %d), want all null but version 2", got[1].b, got[1].version)
	}
	// The last step hid last_seen only: the watchers were sent the status
	// with last_seen null.
	if m := decode(t, stranger.frames()[3].b); m.LastSeen != nil || m.Status == nil {
		t.Errorf("last_seen hidden: %s", stranger.frames()[3].b)
	}
}

// TestSelfSeesInvisible: the user's own sockets are sent their true
// status, everyone else the public one.
func TestSelfSeesInvisible(t *testing.T) {
	h := newHub(t, newRels(), fanout.Config{})
	self, other := newSink("target"), newSink("other")
	subscribe(t, h, self, "target")
	subscribe(t, h, other, "target")
	ev := event("target", presence.Offline, 3, presence.Settings{})
	ev.Self = presence.Invisible
	h.Publish(ev)
	if st, _, _ := lastOf(t, self); st != "invisible" {
		t.Errorf("own socket: %q, want invisible", st)
	}
	if st, _, _ := lastOf(t, other); st != "offline" {
		t.Errorf("other: %q, want offline", st)
	}
}

// TestContactsChangedReveals: a watcher added to or removed from a
// contacts-only user's list is sent its new view at once, read after the
// change; a watcher whose view did not change gets nothing.
func TestContactsChangedReveals(t *testing.T) {
	r := newRels()
	r.set("target", "friend")
	h := newHub(t, r, fanout.Config{})
	friend, stranger, self := newSink("friend"), newSink("stranger"), newSink("target")
	for _, s := range []*sink{friend, stranger, self} {
		subscribe(t, h, s, "target")
	}
	snap := presence.Snapshot{UserID: "target", Known: true, Status: presence.Busy, Text: "t", Devices: 1,
		LastSeen: ms, PubLastSeen: ms, Version: 10, Settings: presence.Settings{Status: presence.Contacts}}
	reads := 0
	state := func(_ context.Context, user string) (presence.Snapshot, error) {
		reads++
		if user != "target" {
			t.Errorf("state read of %q", user)
		}
		return snap, nil
	}
	ctx := context.Background()
	r.set("target", "friend", "stranger")
	h.ContactsChanged(ctx, "target", []string{"friend", "stranger"}, state)
	if st, v, n := lastOf(t, stranger); n != 1 || st != "busy" || v != 10 {
		t.Errorf("added: stranger got %q v%d (%d frames), want busy v10", st, v, n)
	}
	if friend.count() != 0 || self.count() != 0 {
		t.Errorf("friend %d, self %d frames; want none (their views did not change)", friend.count(), self.count())
	}
	snap.Version = 11
	r.set("target")
	h.ContactsChanged(ctx, "target", nil, state)
	if st, v, n := lastOf(t, stranger); n != 2 || st != "" || v != 11 {
		t.Errorf("removed: stranger's last frame %q v%d (%d frames), want null v11", st, v, n)
	}
	if st, v, n := lastOf(t, friend); n != 1 || st != "" || v != 11 {
		t.Errorf("removed: friend's last frame %q v%d (%d frames), want null v11", st, v, n)
	}
	// A list that changes nothing anyone sees reads nothing.
	before := reads
	h.ContactsChanged(ctx, "target", nil, state)
	if reads != before || h.Stats().Revealed != 3 {
		t.Errorf("a change of nobody's view: %d more reads, stats %+v", reads-before, h.Stats())
	}
	// Once everyone may see, the list changes no view: nothing is sent.
	snap.Settings = presence.Settings{}
	r.set("target", "friend")
	h.ContactsChanged(ctx, "target", []string{"friend"}, state)
	if friend.count() != 1 {
		t.Errorf("a list that decides nothing sent the friend %d frames", friend.count()-1)
	}
}

// TestContactsChangedPublicVersion: the watchers who gain or lose sight
// of an invisible user whose text changed since they vanished are sent
// the public face at the public version — the lost sight too —, never the
// version only the user sees (which would count the user's hidden
// changes).
func TestContactsChangedPublicVersion(t *testing.T) {
	r := newRels()
	r.set("target", "friend")
	h := newHub(t, r, fanout.Config{})
	friend, stranger := newSink("friend"), newSink("stranger")
	for _, s := range []*sink{friend, stranger} {
		subscribe(t, h, s, "target")
	}
	snap := presence.Snapshot{UserID: "target", Known: true, Status: presence.Invisible, Manual: presence.ManualInvisible,
		Text: "gone fishing", Devices: 1, LastSeen: ms, PubLastSeen: ms - 1000, Version: 12, PubText: "lunch", PubVersion: 10,
		Settings: presence.Settings{Status: presence.Contacts}}
	state := func(context.Context, string) (presence.Snapshot, error) { return snap, nil }
	r.set("target", "stranger")
	h.ContactsChanged(context.Background(), "target", []string{"stranger"}, state)
	if st, v, n := lastOf(t, stranger); n != 1 || st != "offline" || v != 10 {
		t.Errorf("gained sight: %q v%d (%d frames), want offline v10", st, v, n)
	}
	if st, v, n := lastOf(t, friend); n != 1 || st != "" || v != 10 {
		t.Errorf("lost sight: %q v%d (%d frames), want null v10", st, v, n)
	}
	for _, s := range []*sink{friend, stranger} {
		for _, f := range s.frames() {
			if strings.Contains(string(f.b), "gone fishing") {
				t.Errorf("%s was sent the user's own text: %s", s.viewer, f.b)
			}
		}
	}
}

// TestAsyncKeepsALostSight: a celebrity's change of settings that waits in
// the batched path's queue and is then overtaken by a newer change (or
// arrives after it, late) still tells the watchers who lost sight.
func TestAsyncKeepsALostSight(t *testing.T) {
	everyone, contacts := presence.Settings{}, presence.Settings{Status: presence.Contacts}
	later := event("celeb", presence.Away, 3, contacts) // hidden from all but fan1
	later.Self = presence.Away
	for _, tc := range []struct {
		name   string
		events []*presence.Event
	}{
		{"overtaken", []*presence.Event{settingsEvent("celeb", 2, everyone, contacts), later}},
		{"late", []*presence.Event{later, settingsEvent("celeb", 2, everyone, contacts)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRels()
			r.set("celeb", "fan1")
			h := newHub(t, r, fanout.Config{AsyncThreshold: 10, AsyncBatch: 3})
			fans := celebrity(t, h, 12)
			for _, ev := range tc.events {
				h.Publish(ev)
			}
			runHub(t, h)
			testwait.For(t, "every fan to hear", func() bool {
				for _, s := range fans {
					if s.count() == 0 {
						return false
					}
				}
				return true
			})
			testwait.For(t, "the queue to drain", func() bool { return h.Stats().AsyncPending == 0 })
			for i, s := range fans {
				st, v, n := lastOf(t, s)
				want := ""
				if i == 1 {
					want = "away"
				}
				if n != 1 || st != want || v != 3 {
					t.Errorf("%s: %q v%d (%d frames), want %q v3 once", s.viewer, st, v, n, want)
				}
			}
		})
	}
}
