package tracker_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tracker"
)

// partStore is a tracker.Store over a memstore in two parts, as a Redis
// Cluster of two masters: users whose id starts with "b" are in part 1,
// the others in part 0. A part switched off fails every call about its
// users (calls about many users answer for the other part, with a
// PartialError for the rest, as redisstore does). It counts the calls
// that reach each part.
type partStore struct {
	s     tracker.Store
	off   [2]atomic.Bool
	calls [2]atomic.Int64
	// skipped[p]: a checkpoint (DirtyParts) left part p alone
	skipped [2]atomic.Int64
}

// ExpireParts and DirtyParts make it a tracker.PartSweeper (over a
// memstore, which has no parts: they record what was skipped).
func (s *partStore) ExpireParts(ctx context.Context, now int64, max int, skip func(int) bool, out []presence.Change) ([]presence.Change, error) {
	return s.s.Expire(ctx, now, max, out)
}

func (s *partStore) DirtyParts(ctx context.Context, skip func(int) bool, out []presence.Profile) ([]presence.Profile, error) {
	for p := range s.skipped {
		if skip(p) {
			s.skipped[p].Add(1)
		}
	}
	return s.s.Dirty(ctx, out)
}

func part(user string) int {
	if user != "" && user[0] == 'b' {
		return 1
	}
	return 0
}

func (s *partStore) Parts() int                 { return 2 }
func (s *partStore) Part(user string) int       { return part(user) }
func (s *partStore) Ping(context.Context) error { return nil }

func (s *partStore) PingPart(_ context.Context, p int) error {
	if s.off[p].Load() {
		return errStoreGone
	}
	return nil
}

func (s *partStore) user(u string) error {
	p := part(u)
	s.calls[p].Add(1)
	if s.off[p].Load() {
		return errStoreGone
	}
	return nil
}

func (s *partStore) Beat(ctx context.Context, now int64, user, device string, active bool) (presence.Change, error) {
	if err := s.user(user); err != nil {
		return presence.Change{}, err
	}
	return s.s.Beat(ctx, now, user, device, active)
}

func (s *partStore) SetStatus(ctx context.Context, now int64, user string, m presence.Manual, text string) (presence.Change, error) {
	if err := s.user(user); err != nil {
		return presence.Change{}, err
	}
	return s.s.SetStatus(ctx, now, user, m, text)
}

func (s *partStore) Bye(ctx context.Context, now int64, user, device string) (presence.Change, error) {
	if err := s.user(user); err != nil {
		return presence.Change{}, err
	}
	return s.s.Bye(ctx, now, user, device)
}

func (s *partStore) Disconnect(ctx context.Context, now int64, user, device string, since int64) (presence.Change, error) {
	if err := s.user(user); err != nil {
		return presence.Change{}, err
	}
	return s.s.Disconnect(ctx, now, user, device, since)
}

func (s *partStore) SetSettings(ctx context.Context, now int64, user string, set *presence.Settings) (presence.Change, error) {
	if err := s.user(user); err != nil {
		return presence.Change{}, err
	}
	return s.s.SetSettings(ctx, now, user, set)
}

func (s *partStore) Load(ctx context.Context, now int64, p *presence.Profile) error {
	if err := s.user(p.UserID); err != nil {
		return err
	}
	return s.s.Load(ctx, now, p)
}

func (s *partStore) Expire(ctx context.Context, now int64, max int, out []presence.Change) ([]presence.Change, error) {
	return s.s.Expire(ctx, now, max, out)
}

func (s *partStore) Get(ctx context.Context, now int64, ids []string, out []presence.Snapshot) error {
	if err := s.s.Get(ctx, now, ids, out); err != nil {
		return err
	}
	var failed []int
	for i, id := range ids {
		if s.off[part(id)].Load() {
			out[i] = presence.Snapshot{UserID: id}
			failed = append(failed, i)
		}
	}
	if len(failed) == len(ids) {
		return errStoreGone
	}
	if len(failed) > 0 {
		return &tracker.PartialError{Failed: failed, Err: errStoreGone}
	}
	return nil
}

func (s *partStore) Dirty(ctx context.Context, out []presence.Profile) ([]presence.Profile, error) {
	return s.s.Dirty(ctx, out)
}

func (s *partStore) Debug(ctx context.Context, user string) (presence.User, int64, bool, error) {
	return s.s.Debug(ctx, user)
}

// One part of the store goes away: only its users' operations are
// buffered (the other part's go to the store and are published at once,
// the store is not down as a whole), reads of its users are degraded
// (from the durable store and the buffer), and when it answers again its
// users' buffer is replayed: nobody who kept beating went offline.
func TestOneOfTwoPartsDown(t *testing.T) {
	d := newMemDurable()
	ps := &partStore{s: memstore.New(memstore.Config{Rules: rules})}
	f := &fixture{t: t, ctx: context.Background(), clock: clock.NewFake(start), durable: d, pub: &recorder{}}
	tr, err := tracker.New(tracker.Config{Store: ps, Durable: d, Publisher: f.pub, Clock: f.clock, Rules: rules,
		ProbeInterval: 5 * time.Millisecond, SweepInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f.tr = tr
	runTracker(t, tr)
	f.beat("ann", "phone", true)
	f.beat("bob", "phone", true)
	f.pub.take()

	ps.off[1].Store(true)
	f.at(10 * time.Second)
	f.beat("bob", "phone", true) // finds part 1 down
	f.beat("ann", "phone", true)
	bobCalls := ps.calls[1].Load()
	f.status("ann", presence.ManualBusy, "")
	f.status("bob", presence.ManualBusy, "")
	f.beat("bob", "phone", true)
	f.beat("cal", "pc", true) // a user part 0 has never seen
	if st := tr.Stats(); st.Down || st.PartsDown != 1 || st.PartOutages != 1 || st.Buffered != 1 {
		t.Fatalf("stats %+v: want the store up, one part down, bob alone buffered", st)
	}
	if n := ps.calls[1].Load() - bobCalls; n != 0 {
		t.Errorf("%d calls reached the part that is down after it was found down", n)
	}
	f.wantEvents("part 0 goes on", "ann online→busy seen=10s", "cal offline→online seen=10s")
	// A checkpoint leaves the part that is down alone (it would wait on
	// it), and does the other.
	if err := tr.Checkpoint(f.ctx); err != nil {
		t.Fatal(err)
	}
	if ps.skipped[1].Load() == 0 || ps.skipped[0].Load() != 0 {
		t.Errorf("checkpoint skipped part 0 %d times, part 1 %d times; want part 1 only", ps.skipped[0].Load(), ps.skipped[1].Load())
	}
	got := f.read("ann", "bob", "cal")
	for i, want := range []presence.Status{presence.Busy, presence.Busy, presence.Online} {
		if got[i].Status != want {
			t.Errorf("%s reads %v while part 1 is down, want %v", got[i].UserID, got[i].Status, want)
		}
	}

	f.at(50 * time.Second) // longer than the ttl since bob's last beat before the outage
	f.beat("bob", "phone", true)
	f.beat("ann", "phone", true)
	f.beat("cal", "pc", true)
	ps.off[1].Store(false)
	testwait.For(t, "part 1 back", func() bool { return tr.Stats().PartsDown == 0 })
	f.wantEvents("replay of part 1", "bob online→busy seen=10s") // the last change it made, still true
	if st := tr.Stats(); st.Buffered != 0 || st.Down {
		t.Errorf("after part 1 came back: %+v", st)
	}
	f.at(50*time.Second + 3*time.Second)
	f.sweep()
	f.wantEvents("sweep after the replay") // bob kept beating: nobody offline
	if s := f.read("bob")[0]; s.Status != presence.Busy {
		t.Errorf("bob reads %v after the replay, want busy", s.Status)
	}
}

// floorParts is a partStore whose floors' check finds part 1 silent, as
// redisstore's does with one Cluster master down.
type floorParts struct{ *partStore }

func (s floorParts) RaiseFloor(context.Context, uint64) error { return nil }

func (s floorParts) CheckFloor(context.Context) (bool, error) {
	if s.off[1].Load() {
		return true, &tracker.PartialError{Failed: []int{1}, Parts: []int{1}, Err: errStoreGone}
	}
	return true, nil
}

// The check of the floors, which every node makes every second, marks a
// part it finds silent down — a node whose users are all on other parts
// learns of the outage so, and its sweeps and checkpoints leave the part
// alone — and takes neither the store for down nor for reset.
func TestFloorCheckMarksSilentPartsDown(t *testing.T) {
	ps := &partStore{s: memstore.New(memstore.Config{Rules: rules})}
	tr, err := tracker.New(tracker.Config{Store: floorParts{ps}, Durable: newMemDurable(), Publisher: &recorder{},
		Clock: clock.NewFake(start), Rules: rules, ProbeInterval: time.Hour, SweepInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ps.off[1].Store(true)
	tr.CheckFloor(context.Background())
	if st := tr.Stats(); st.PartsDown != 1 || st.Down || st.StoreResets != 0 {
		t.Errorf("after a floors' check that found part 1 silent: %+v; want part 1 down, the store up, no reset", st)
	}
	ps.off[1].Store(false)
	tr.RecoverParts(context.Background())
	if st := tr.Stats(); st.PartsDown != 0 {
		t.Errorf("part 1 answers again, but %d parts are down", st.PartsDown)
	}
}
