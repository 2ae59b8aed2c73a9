package wire_test

import (
	"encoding/json"
	"reflect"
	"strconv"
	"testing"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
	"github.com/presenced/presenced/internal/wire"
)

// big is a version above 2^53, written as the exact number it is, as a
// user's version is in a change.
const big = uint64(1<<53 + 1)

var (
	alice = privacy.View{UserID: "alice", StatusVisible: true, Status: presence.Online, Version: 3}
	bob   = privacy.View{UserID: "bob", StatusVisible: true, Status: presence.Busy, Text: "focus", LastSeenVisible: true, LastSeen: ms}
	carol = privacy.View{UserID: "carol", Status: presence.Away} // status hidden from the viewer
)

func num(n uint64) json.Number { return json.Number(strconv.FormatUint(n, 10)) }

func TestAppendRoom(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interval bool
		count    int
		members  []privacy.View
		next     string
		version  uint64
		exact    string
		want     map[string]any
	}{
		{"events, last page", false, 3, []privacy.View{alice, bob, carol}, "", 7,
			`{"type":"room","mode":"events","room":"doc-42","count":3,"members":{"alice":"online","bob":"busy","carol":null},"next":null,"version":7}`,
			map[string]any{"type": "room", "room": "doc-42", "mode": "events", "count": json.Number("3"),
				"members": map[string]any{"alice": "online", "bob": "busy", "carol": nil}, "next": nil, "version": json.Number("7")}},
		{"interval, more follow", true, 100412, []privacy.View{alice, bob}, "bob", big,
			`{"type":"room","mode":"interval","room":"doc-42","count":100412,"members":{"alice":"online","bob":"busy"},"next":"bob","version":9007199254740993}`,
			map[string]any{"type": "room", "room": "doc-42", "mode": "interval", "count": json.Number("100412"),
				"members": map[string]any{"alice": "online", "bob": "busy"}, "next": "bob", "version": num(big)}},
		{"empty room without events", false, 0, nil, "", 0,
			`{"type":"room","mode":"events","room":"doc-42","count":0,"members":{},"next":null,"version":0}`,
			map[string]any{"type": "room", "room": "doc-42", "mode": "events", "count": json.Number("0"),
				"members": map[string]any{}, "next": nil, "version": json.Number("0")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := wire.AppendRoom([]byte("xx"), "doc-42", tc.interval, tc.count, tc.members, tc.next, tc.version)
			if string(out[:2]) != "xx" {
				t.Fatalf("prefix lost: %s", out)
			}
			if string(out[2:]) != tc.exact {
				t.Errorf("got  %s\nwant %s", out[2:], tc.exact)
			}
			if got := decode(t, out[2:]); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("decoded %v\n   want %v", got, tc.want)
			}
		})
	}
}

func TestAppendRoomChange(t *testing.T) {
	join := presence.RoomEvent{Room: "doc-42", UserID: "dave", Kind: presence.RoomJoin, Reason: presence.ReasonVisible, Count: 4, Version: 8, At: ms}
	leave := presence.RoomEvent{Room: "doc-42", UserID: "dave", Kind: presence.RoomLeave, Reason: presence.ReasonBye, Count: 3, Version: big, At: ms}
	dave := privacy.View{UserID: "dave", StatusVisible: true, Status: presence.Online, Version: 5}
	daveHidden := privacy.View{UserID: "dave", Status: presence.Online}
	for _, tc := range []struct {
		name  string
		ev    presence.RoomEvent
		view  *privacy.View
		exact string
	}{
		{"join, status visible", join, &dave,
			`{"type":"room_change","room":"doc-42","user_id":"dave","event":"join","status":"online","count":4,"version":8}`},
		{"join, status hidden", join, &daveHidden,
			`{"type":"room_change","room":"doc-42","user_id":"dave","event":"join","status":null,"count":4,"version":8}`},
		{"join, no view", join, nil,
			`{"type":"room_change","room":"doc-42","user_id":"dave","event":"join","status":null,"count":4,"version":8}`},
		// A leave says no status, even to a viewer who saw it.
		{"leave", leave, &dave,
			`{"type":"room_change","room":"doc-42","user_id":"dave","event":"leave","status":null,"count":3,"version":9007199254740993}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := wire.AppendRoomChange(nil, &tc.ev, tc.view)
			if string(out) != tc.exact {
				t.Errorf("got  %s\nwant %s", out, tc.exact)
			}
			var status any
			if tc.ev.Kind == presence.RoomJoin && tc.view != nil && tc.view.StatusVisible {
				status = tc.view.Status.String()
			}
			want := map[string]any{"type": "room_change", "room": tc.ev.Room, "user_id": tc.ev.UserID, "event": tc.ev.Kind.String(),
				"status": status, "count": json.Number(strconv.Itoa(tc.ev.Count)), "version": num(tc.ev.Version)}
			if got := decode(t, out); !reflect.DeepEqual(got, want) {
				t.Errorf("decoded %v\n   want %v", got, want)
			}
		})
	}
}

func TestAppendRoomStatus(t *testing.T) {
	away := privacy.View{UserID: "bob", StatusVisible: true, Status: presence.Away, Text: "lunch", Version: 12}
	for _, tc := range []struct {
		v     privacy.View
		exact string
	}{
		{away, `{"type":"room_change","room":"r","user_id":"bob","event":"status","status":"away","count":4,"version":8}`},
		{carol, `{"type":"room_change","room":"r","user_id":"carol","event":"status","status":null,"count":4,"version":8}`},
	} {
		out := wire.AppendRoomStatus(nil, "r", &tc.v, 4, 8)
		if string(out) != tc.exact {
			t.Errorf("got  %s\nwant %s", out, tc.exact)
		}
		var status any
		if tc.v.StatusVisible {
			status = tc.v.Status.String()
		}
		want := map[string]any{"type": "room_change", "room": "r", "user_id": tc.v.UserID, "event": "status",
			"status": status, "count": json.Number("4"), "version": json.Number("8")}
		if got := decode(t, out); !reflect.DeepEqual(got, want) {
			t.Errorf("decoded %v\n   want %v", got, want)
		}
	}
}

func TestAppendRoomEvent(t *testing.T) {
	ev := presence.RoomEvent{Room: "doc-42", UserID: "dave", Kind: presence.RoomJoin, Reason: presence.ReasonJoined, Count: 4, Version: 8, At: ms}
	want := `{"room":"doc-42","user_id":"dave","event":"join","reason":"joined","count":4,"version":8,"at":"2026-11-22T23:08:49.123Z"}`
	if got := string(wire.AppendRoomEvent(nil, &ev)); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	for _, tc := range []struct {
		kind   presence.RoomKind
		reason presence.RoomReason
		words  [2]string
	}{
		{presence.RoomJoin, presence.ReasonJoined, [2]string{"join", "joined"}},
		{presence.RoomJoin, presence.ReasonVisible, [2]string{"join", "visible"}},
		{presence.RoomLeave, presence.ReasonLeft, [2]string{"leave", "left"}},
		{presence.RoomLeave, presence.ReasonBye, [2]string{"leave", "bye"}},
		{presence.RoomLeave, presence.ReasonEnded, [2]string{"leave", "ended"}},
		{presence.RoomLeave, presence.ReasonInvisible, [2]string{"leave", "invisible"}},
	} {
		ev := presence.RoomEvent{Room: "r\"1", UserID: "zoë", Kind: tc.kind, Reason: tc.reason, Count: 0, Version: big, At: 0}
		got := decode(t, wire.AppendRoomEvent(nil, &ev))
		want := map[string]any{"room": "r\"1", "user_id": "zoë", "event": tc.words[0], "reason": tc.words[1],
			"count": json.Number("0"), "version": num(big), "at": "1970-01-01T00:00:00.000Z"}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%v %v: decoded %v\n   want %v", tc.kind, tc.reason, got, want)
		}
	}
}

func TestAppendRoomCounts(t *testing.T) {
	for _, tc := range []struct {
		rooms  []string
		counts []int
		want   string
	}{
		{nil, nil, `{}`},
		{[]string{"a", "b"}, []int{3, 0}, `{"a":3,"b":0}`},
		{[]string{"doc\u2028", "名前"}, []int{100412, 1}, `{"doc\u2028":100412,"名前":1}`},
	} {
		out := wire.AppendRoomCounts(nil, tc.rooms, tc.counts)
		if string(out) != tc.want {
			t.Errorf("got  %s\nwant %s", out, tc.want)
		}
		got := decode(t, out)
		if len(got) != len(tc.rooms) {
			t.Errorf("%s: %d rooms, want %d", out, len(got), len(tc.rooms))
		}
		for i, r := range tc.rooms {
			if got[r] != json.Number(strconv.Itoa(tc.counts[i])) {
				t.Errorf("%s: %q is %v, want %d", out, r, got[r], tc.counts[i])
			}
		}
	}
}

func TestAppendRoomInterval(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		joined, left         []string
		moreJoined, moreLeft int
		version              uint64
		exact                string
	}{
		{"quiet", nil, nil, 0, 0, 9,
			`{"type":"room_interval","room":"big","count":100412,"joined":[],"left":[],"more_joined":0,"more_left":0,"version":9}`},
		{"one joined", []string{"u1"}, []string{}, 0, 0, 9,
			`{"type":"room_interval","room":"big","count":100412,"joined":["u1"],"left":[],"more_joined":0,"more_left":0,"version":9}`},
		{"busy", []string{"u1", "u2"}, []string{"u3"}, 1200, 37, big,
			`{"type":"room_interval","room":"big","count":100412,"joined":["u1","u2"],"left":["u3"],"more_joined":1200,"more_left":37,"version":9007199254740993}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := wire.AppendRoomInterval(nil, "big", 100412, tc.joined, tc.left, tc.moreJoined, tc.moreLeft, tc.version)
			if string(out) != tc.exact {
				t.Errorf("got  %s\nwant %s", out, tc.exact)
			}
			list := func(ss []string) []any {
				l := []any{}
				for _, s := range ss {
					l = append(l, s)
				}
				return l
			}
			want := map[string]any{"type": "room_interval", "room": "big", "count": json.Number("100412"),
				"joined": list(tc.joined), "left": list(tc.left), "more_joined": json.Number(strconv.Itoa(tc.moreJoined)),
				"more_left": json.Number(strconv.Itoa(tc.moreLeft)), "version": num(tc.version)}
			if got := decode(t, out); !reflect.DeepEqual(got, want) {
				t.Errorf("decoded %v\n   want %v", got, want)
			}
		})
	}
}

// TestRoomAllocs: every room encoder appends into a buffer with room
// without allocating.
func TestRoomAllocs(t *testing.T) {
	ev := presence.RoomEvent{Room: "doc-42", UserID: "dave", Kind: presence.RoomJoin, Reason: presence.ReasonJoined, Count: 4, Version: big, At: ms}
	members := []privacy.View{alice, bob, carol}
	rooms, counts := []string{"a", "b"}, []int{3, 0}
	joined, left := []string{"u1", "u2"}, []string{"u3"}
	buf := make([]byte, 0, 1024)
	for name, f := range map[string]func(){
		"AppendRoom":         func() { buf = wire.AppendRoom(buf[:0], "doc-42", false, 3, members, "carol", big) },
		"AppendRoomChange":   func() { buf = wire.AppendRoomChange(buf[:0], &ev, &alice) },
		"AppendRoomStatus":   func() { buf = wire.AppendRoomStatus(buf[:0], "doc-42", &bob, 4, big) },
		"AppendRoomEvent":    func() { buf = wire.AppendRoomEvent(buf[:0], &ev) },
		"AppendRoomCounts":   func() { buf = wire.AppendRoomCounts(buf[:0], rooms, counts) },
		"AppendRoomInterval": func() { buf = wire.AppendRoomInterval(buf[:0], "big", 100412, joined, left, 5, 6, big) },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocations, want 0", name, n)
		}
	}
}

func BenchmarkAppendRoom(b *testing.B) {
	members := make([]privacy.View, 100)
	for i := range members {
		members[i] = privacy.View{UserID: "user-" + strconv.Itoa(i), StatusVisible: i%3 != 0, Status: presence.Online}
	}
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		buf = wire.AppendRoom(buf[:0], "doc-42", false, 250, members, "user-99", 4294967302)
	}
}

// FuzzRoomMessages: whatever the ids of a room and its members hold,
// every room message is valid JSON and the ids come back as they were
// (invalid UTF-8 as U+FFFD).
func FuzzRoomMessages(f *testing.F) {
	f.Add("doc-42", "dave", "bob", uint64(1), 3)
	f.Add("\xff\u2028", "\x00\"\\", "", uint64(1<<53), -1)
	f.Add("", "a\u2029b", "\x7f", uint64(1<<64-1), 1<<62)
	f.Fuzz(func(t *testing.T, room, user, next string, version uint64, count int) {
		ev := presence.RoomEvent{Room: room, UserID: user, Kind: presence.RoomLeave, Reason: presence.ReasonEnded, Count: count, Version: version, At: int64(count)}
		v := privacy.View{UserID: user, StatusVisible: true, Status: presence.Busy}
		for _, out := range [][]byte{
			wire.AppendRoom(nil, room, count%2 == 0, count, []privacy.View{v, {UserID: next}}, next, version),
			wire.AppendRoomChange(nil, &ev, &v),
			wire.AppendRoomStatus(nil, room, &v, count, version),
			wire.AppendRoomEvent(nil, &ev),
			wire.AppendRoomCounts(nil, []string{room, user}, []int{count, 0}),
			wire.AppendRoomInterval(nil, room, count, []string{user, next}, nil, count, count, version),
		} {
			if !json.Valid(out) {
				t.Fatalf("not valid JSON: %q", out)
			}
		}
		for _, out := range [][]byte{
			wire.AppendRoomChange(nil, &ev, &v),
			wire.AppendRoomStatus(nil, room, &v, count, version),
			wire.AppendRoomEvent(nil, &ev),
		} {
			m := decode(t, out)
			if m["room"] != string([]rune(room)) || m["user_id"] != string([]rune(user)) {
				t.Fatalf("room %q, user %q came back as %q, %q", room, user, m["room"], m["user_id"])
			}
			if m["version"] != num(version) || m["count"] != json.Number(strconv.Itoa(count)) {
				t.Fatalf("version %d, count %d came back as %v, %v", version, count, m["version"], m["count"])
			}
		}
		m := decode(t, wire.AppendRoom(nil, room, false, count, []privacy.View{v}, next, version))
		if members := m["members"].(map[string]any); members[string([]rune(user))] != "busy" {
			t.Fatalf("member %q came back as %v", user, members)
		}
		if wantNext := any(string([]rune(next))); next == "" && m["next"] != nil || next != "" && m["next"] != wantNext {
			t.Fatalf("next %q came back as %v", next, m["next"])
		}
	})
}
