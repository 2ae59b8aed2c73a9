package replica

import (
	"context"
	"errors"
	"testing"

	"github.com/presenced/presenced/internal/presence"
)

// setFull puts a user with a text, devices and last_seen in the source.
func (s *source) setFull(u presence.Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.users == nil {
		s.users = make(map[string]presence.Snapshot)
	}
	u.Known = true
	s.users[u.UserID] = u
}

func getFull(t *testing.T, r *Replica, now int64, ids ...string) []presence.Snapshot {
	t.Helper()
	out := make([]presence.Snapshot, len(ids))
	if err := r.GetFull(context.Background(), now, ids, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// A full view is read through once and then answered from memory, with
// the public face (an invisible user's frozen text and version), the
// devices, and last_seen now while the user is present; a change or a
// device note makes the next read go to the store again.
func TestFullViewsKeptUntilAChangeOrANote(t *testing.T) {
	for _, max := range []int{0, 1000} {
		src := &source{}
		src.setFull(presence.Snapshot{UserID: "a", Status: presence.Busy, Text: "lunch", Devices: 2, Version: 9, PubLastSeen: 500, LastSeen: 500})
		src.setFull(presence.Snapshot{UserID: "gone", Status: presence.Offline, Text: "bye", Version: 4, PubLastSeen: 300, LastSeen: 300})
		src.setFull(presence.Snapshot{UserID: "inv", Status: presence.Invisible, Text: "secret", Devices: 1, Version: 12,
			PubText: "before", PubVersion: 10, PubLastSeen: 200, LastSeen: 900})
		r := run(t, Config{Source: src, Max: max})
		awaitReady(t, r)
		r.NotesUp(true)
		const now = 1000
		for round := range 2 {
			got := getFull(t, r, now, "a", "gone", "inv", "nobody")
			a, gone, inv, nobody := got[0], got[1], got[2], got[3]
			if a.Status != presence.Busy || a.Text != "lunch" || a.Devices != 2 || a.PubLastSeen != now || a.LastSeen != now {
				t.Errorf("max %d round %d: a = %+v", max, round, a)
			}
			if tx, v := a.Public(); tx != "lunch" || v != 9 {
				t.Errorf("max %d round %d: a shows %q v%d", max, round, tx, v)
			}
			if gone.Status != presence.Offline || gone.PubLastSeen != 300 {
				t.Errorf("max %d round %d: gone = %+v", max, round, gone)
			}
			if tx, v := inv.Public(); inv.Status != presence.Offline || tx != "before" || v != 10 || inv.PubLastSeen != 200 || inv.Text == "secret" {
				t.Errorf("max %d round %d: the invisible user shows %+v", max, round, inv)
			}
			if nobody.Known {
				t.Errorf("max %d round %d: nobody = %+v", max, round, nobody)
			}
		}
		// The second round from memory, but for "nobody" in a replica of
		// every user, which holds no one the store does not.
		unheld := int32(0)
		if max == 0 {
			unheld = 1
		}
		if n := src.reads.Load(); n != 4+unheld {
			t.Errorf("max %d: %d users read from the store, want %d", max, n, 4+unheld)
		}

		// A second device: the store's note.
		src.setFull(presence.Snapshot{UserID: "a", Status: presence.Busy, Text: "lunch", Devices: 3, Version: 9, PubLastSeen: 500})
		if got := getFull(t, r, now, "a")[0]; got.Devices != 2 {
			t.Fatalf("max %d: before the note a shows %d devices, want the 2 kept", max, got.Devices)
		}
		r.NoteDevices("a")
		if got := getFull(t, r, now, "a")[0]; got.Devices != 3 {
			t.Errorf("max %d: after the note a shows %d devices, want 3", max, got.Devices)
		}
		// A change: the text goes, the version moves on.
		src.setFull(presence.Snapshot{UserID: "a", Status: presence.Online, Devices: 1, Version: 10, PubLastSeen: 600})
		r.Publish(&presence.Event{UserID: "a", Status: presence.Online, Version: 10, LastSeen: 600})
		if got := getFull(t, r, now, "a")[0]; got.Status != presence.Online || got.Text != "" || got.Devices != 1 {
			t.Errorf("max %d: after the change a = %+v", max, got)
		}
		reads := src.reads.Load()
		getFull(t, r, now, "a")
		if src.reads.Load() != reads {
			t.Errorf("max %d: a read through again with nothing changed", max)
		}
		st := r.Stats()
		if st.Noted != 1 || st.FullMisses != 6+uint64(unheld) || !st.NotesUp {
			t.Errorf("max %d: stats %+v", max, st)
		}
	}
}

// A note that comes while a read of the user is in flight: the read may
// have missed the change, so what it found is answered once but not kept.
func TestFullViewNoteDuringRead(t *testing.T) {
	src := &source{}
	src.setFull(presence.Snapshot{UserID: "a", Status: presence.Online, Devices: 1, Version: 5})
	r := run(t, Config{Source: src, Max: 100})
	awaitReady(t, r)
	r.NotesUp(true)
	src.during = func() {
		src.during = nil
		src.setFull(presence.Snapshot{UserID: "a", Status: presence.Online, Devices: 2, Version: 5})
		r.NoteDevices("a")
	}
	if got := getFull(t, r, 1, "a")[0]; got.Devices != 1 {
		t.Fatalf("the read in flight answers %d devices, want what it read (1)", got.Devices)
	}
	if got := getFull(t, r, 1, "a")[0]; got.Devices != 2 {
		t.Errorf("the next read answers %d devices, want 2: the read before the note was kept", got.Devices)
	}
	// The status is kept all the same.
	reads := src.reads.Load()
	if got := get(t, r, "a")[0]; got.Status != presence.Online || src.reads.Load() != reads {
		t.Errorf("status %v, %d reads more", got.Status, src.reads.Load()-reads)
	}
}

// Without the notes a full view is never answered from memory: GetFull
// refuses; once they are heard again, what was kept before is read again.
func TestFullViewsWaitForTheNotes(t *testing.T) {
	src := &source{}
	src.setFull(presence.Snapshot{UserID: "a", Status: presence.Online, Devices: 1, Version: 5})
	r := run(t, Config{Source: src, Max: 100})
	awaitReady(t, r)
	out := make([]presence.Snapshot, 1)
	if err := r.GetFull(context.Background(), 1, []string{"a"}, out); !errors.Is(err, ErrNotReady) {
		t.Fatalf("before the notes: %v, want ErrNotReady", err)
	}
	r.NotesUp(true)
	getFull(t, r, 1, "a")
	r.NotesUp(false)
	if err := r.GetFull(context.Background(), 1, []string{"a"}, out); !errors.Is(err, ErrNotReady) {
		t.Fatalf("notes lost: %v, want ErrNotReady", err)
	}
	src.setFull(presence.Snapshot{UserID: "a", Status: presence.Online, Devices: 4, Version: 5})
	r.NotesUp(true)
	if got := getFull(t, r, 1, "a")[0]; got.Devices != 4 {
		t.Errorf("after the notes came back: %d devices, want 4 (read again)", got.Devices)
	}
	// A status read never needed the notes.
	r.NotesUp(false)
	if got := get(t, r, "a")[0]; got.Status != presence.Online {
		t.Errorf("status %v", got.Status)
	}
}

// A replica of every user makes no slot for a full view of an id the
// store does not hold: reads of made-up ids never grow it.
func TestFullViewsOfMadeUpIDs(t *testing.T) {
	src := &source{}
	src.setFull(presence.Snapshot{UserID: "a", Status: presence.Online, Devices: 1, Version: 5})
	r := run(t, Config{Source: src})
	awaitReady(t, r)
	r.NotesUp(true)
	ids := []string{"a", "x1", "x2", "x3"}
	for range 2 {
		got := getFull(t, r, 1, ids...)
		if got[0].Devices != 1 || got[1].Known {
			t.Fatalf("%+v", got)
		}
	}
	if st := r.Stats(); st.Users != 1 {
		t.Errorf("%d users held after reads of made-up ids, want 1", st.Users)
	}
	// a was kept: its second read came from memory.
	if st := r.Stats(); st.FullMisses != 4+3 {
		t.Errorf("%d users read through, want 7 (a once, the made-up ids each time)", st.FullMisses)
	}
}
