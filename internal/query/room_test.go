package query_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/query"
	"github.com/presenced/presenced/internal/tracker"
)

// trackerDurable is durable as a tracker's durable store: the writes are
// dropped (the tracker keeps what it applies in the memory store).
type trackerDurable struct{ *durable }

func (trackerDurable) SaveStatus(context.Context, string, presence.Manual, string) error { return nil }
func (trackerDurable) SaveSettings(context.Context, string, presence.Settings) error     { return nil }
func (trackerDurable) SaveLastSeen(context.Context, []presence.Profile) error            { return nil }

// roomPages adapts the tracker's pages to the reader's, as the app does.
type roomPages struct{ t *tracker.Tracker }

func (p roomPages) RoomPage(ctx context.Context, room, after string, limit int, out []string) (query.RoomPage, error) {
	pg, err := p.t.RoomPage(ctx, room, after, limit, out)
	return query.RoomPage(pg), err
}

// roomNode is a tracker on a memory store with rooms, and a reader of it.
func roomNode(t *testing.T, d *durable) (*tracker.Tracker, *query.Reader) {
	t.Helper()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := clock.NewFake(t0)
	rules := presence.Rules{TTL: 30 * time.Second, IdleAfter: 5 * time.Minute}
	store := memstore.New(memstore.Config{Rules: rules})
	tr, err := tracker.New(tracker.Config{Store: store, Durable: trackerDurable{d}, Clock: clk, Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	r, err := query.New(query.Config{States: tr, Profiles: d, Contacts: d, Clock: clk, Rooms: roomPages{tr}})
	if err != nil {
		t.Fatal(err)
	}
	return tr, r
}

// statuses renders a room view's members as user → status ("" when
// hidden), and fails on a member listed twice.
func statuses(t *testing.T, v query.RoomView) map[string]string {
	t.Helper()
	out := make(map[string]string, len(v.Members))
	for _, m := range v.Members {
		if _, dup := out[m.UserID]; dup {
			t.Fatalf("%s is listed twice", m.UserID)
		}
		out[m.UserID] = ""
		if m.StatusVisible {
			out[m.UserID] = m.Status.String()
		}
	}
	return out
}

// TestRoom: each member is listed with the status its settings show the
// viewer (null where hidden), an invisible member is neither listed nor
// counted, and the viewer sees itself.
func TestRoom(t *testing.T) {
	ctx := context.Background()
	d := &durable{contacts: map[string][]string{"bob": {"carol"}, "dave": {"carol"}}}
	tr, r := roomNode(t, d)
	settings := map[string]presence.Settings{
		"alice": {Status: presence.Everyone, LastSeen: presence.Everyone},
		"bob":   {Status: presence.Contacts, LastSeen: presence.Contacts},
		"dave":  {Status: presence.Nobody, LastSeen: presence.Nobody},
		"eve":   {Status: presence.Everyone, LastSeen: presence.Everyone},
	}
	for _, u := range []string{"alice", "bob", "dave", "eve"} {
		if err := tr.SetSettings(ctx, u, settings[u]); err != nil {
			t.Fatal(err)
		}
		if _, err := tr.Heartbeat(ctx, u, "d", true); err != nil {
			t.Fatal(err)
		}
		if _, err := tr.Join(ctx, u, "d", "r"); err != nil {
			t.Fatalf("%s joins: %v", u, err)
		}
	}
	if _, err := tr.SetStatus(ctx, "bob", presence.ManualBusy, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.SetStatus(ctx, "eve", presence.ManualInvisible, ""); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		viewer string
		want   map[string]string
	}{
		{"", map[string]string{"alice": "online", "bob": "", "dave": ""}},
		{"stranger", map[string]string{"alice": "online", "bob": "", "dave": ""}},
		{"carol", map[string]string{"alice": "online", "bob": "busy", "dave": ""}}, // a contact of bob and dave
		{"dave", map[string]string{"alice": "online", "bob": "", "dave": "online"}},
		{"eve", map[string]string{"alice": "online", "bob": "", "dave": ""}}, // invisible: not even to itself
	} {
		v, err := r.Room(ctx, tc.viewer, "r", "", 10)
		if err != nil {
			t.Fatalf("Room as %q: %v", tc.viewer, err)
		}
		if got := statuses(t, v); !maps.Equal(got, tc.want) {
			t.Errorf("viewer %q: members %v, want %v", tc.viewer, got, tc.want)
		}
		if v.Room != "r" || v.Count != 3 || v.Next != "" || v.Version == 0 {
			t.Errorf("viewer %q: room %q count %d next %q version %d; want r, 3, no next, a version", tc.viewer, v.Room, v.Count, v.Next, v.Version)
		}
	}

	// Back from invisible, eve is a member again.
	if _, err := tr.SetStatus(ctx, "eve", presence.ManualNone, ""); err != nil {
		t.Fatal(err)
	}
	v, err := r.Room(ctx, "", "r", "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := statuses(t, v); v.Count != 4 || got["eve"] != "online" {
		t.Errorf("after eve came back: count %d, members %v", v.Count, got)
	}

	// A room nobody is in.
	v, err = r.Room(ctx, "", "empty", "", 10)
	if err != nil || v.Count != 0 || len(v.Members) != 0 || v.Next != "" {
		t.Errorf("empty room: %+v, %v", v, err)
	}
}

// TestRoomPages: pages of a room list every member once, the cursor of
// each is its last member, and the last page has none.
func TestRoomPages(t *testing.T) {
	ctx := context.Background()
	tr, r := roomNode(t, &durable{})
	var want []string
	for _, u := range []string{"u1", "u2", "u3", "u4", "u5"} {
		if _, err := tr.Heartbeat(ctx, u, "d", true); err != nil {
			t.Fatal(err)
		}
		if _, err := tr.Join(ctx, u, "d", "r"); err != nil {
			t.Fatal(err)
		}
		want = append(want, u)
	}
	var got []string
	after := ""
	for pages := 1; ; pages++ {
		v, err := r.Room(ctx, "", "r", after, 2)
		if err != nil {
			t.Fatal(err)
		}
		if v.Count != 5 || len(v.Members) > 2 {
			t.Fatalf("page %d: count %d, %d members", pages, v.Count, len(v.Members))
		}
		for _, m := range v.Members {
			if !m.StatusVisible || m.Status != presence.Online {
				t.Errorf("page %d: %s shows %+v", pages, m.UserID, m)
			}
			got = append(got, m.UserID)
		}
		if v.Next == "" {
			if pages != 3 {
				t.Errorf("%d pages of 2 for 5 members, want 3", pages)
			}
			break
		}
		if last := v.Members[len(v.Members)-1].UserID; v.Next != last {
			t.Fatalf("page %d: next %q, want its last member %q", pages, v.Next, last)
		}
		if pages > 5 {
			t.Fatal("the pages do not end")
		}
		after = v.Next
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("members over the pages: %v, want %v", got, want)
	}

	for _, limit := range []int{0, query.MaxBatch + 1} {
		if _, err := r.Room(ctx, "", "r", "", limit); err == nil {
			t.Errorf("a page of %d members: no error", limit)
		}
	}
}

// A reader without rooms says so.
func TestRoomWithoutRooms(t *testing.T) {
	d := &durable{}
	r, err := query.New(query.Config{States: memstore.New(memstore.Config{}), Profiles: d, Contacts: d})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Room(context.Background(), "", "r", "", 10); !errors.Is(err, query.ErrNoRooms) {
		t.Errorf("got %v, want ErrNoRooms", err)
	}
}
