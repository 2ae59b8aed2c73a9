package wire_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
	"github.com/presenced/presenced/internal/wire"
)

// decode checks that b is one valid JSON object and returns it decoded with
// numbers kept exact.
func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	if !json.Valid(b) {
		t.Fatalf("not valid JSON: %s", b)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	return m
}

const ms = int64(1795388929123) // 2026-11-22T23:08:49.123Z

var (
	full = privacy.View{UserID: "2", StatusVisible: true, Status: presence.Away, Text: "in a \"meeting\"\n",
		Devices: 2, Version: 4294967302, LastSeenVisible: true, LastSeen: ms}
	noLastSeen = privacy.View{UserID: "3", StatusVisible: true, Status: presence.Online, Version: 4294967297}
	hidden     = privacy.View{UserID: "4"}
	never      = privacy.View{UserID: "5", StatusVisible: true, Status: presence.Offline}
)

func TestAppendPresence(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    privacy.View
		want map[string]any
	}{
		{"full", full, map[string]any{"type": "presence", "user_id": "2", "status": "away",
			"last_seen": "2026-11-22T23:08:49.123Z", "status_text": "in a \"meeting\"\n", "version": json.Number("4294967302")}},
		{"last_seen hidden", noLastSeen, map[string]any{"type": "presence", "user_id": "3", "status": "online",
			"last_seen": nil, "status_text": nil, "version": json.Number("4294967297")}},
		{"status hidden", hidden, map[string]any{"type": "presence", "user_id": "4", "status": nil,
			"last_seen": nil, "status_text": nil, "version": nil}},
		{"never seen", never, map[string]any{"type": "presence", "user_id": "5", "status": "offline",
			"last_seen": nil, "status_text": nil, "version": nil}},
		// A watcher who just lost sight (privacy.Delivery): everything
		// null but the version it was hidden at.
		{"sight lost", privacy.View{UserID: "6", Text: "secret", Version: 9, LastSeen: ms},
			map[string]any{"type": "presence", "user_id": "6", "status": nil, "last_seen": nil, "status_text": nil, "version": json.Number("9")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := wire.AppendPresence([]byte("xx"), &tc.v)
			if string(out[:2]) != "xx" {
				t.Fatalf("prefix lost: %s", out)
			}
			if got := decode(t, out[2:]); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("AppendPresence(%+v) = %s\n got %v\nwant %v", tc.v, out[2:], got, tc.want)
			}
		})
	}
}

func TestAppendPresenceExact(t *testing.T) {
	got := string(wire.AppendPresence(nil, &privacy.View{UserID: "2", StatusVisible: true, Status: presence.Away,
		Version: 4294967302, LastSeenVisible: true, LastSeen: ms}))
	want := `{"type":"presence","user_id":"2","status":"away","last_seen":"2026-11-22T23:08:49.123Z","status_text":null,"version":4294967302}`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// A snapshot with known versions leaves out the views skip names, and
// counts them.
func TestAppendSnapshotKnown(t *testing.T) {
	views := []privacy.View{full, noLastSeen, hidden, never}
	for _, tc := range []struct {
		skip string // user ids left out
		want string
	}{
		{"", `"2","3","4","5" unchanged 0`},
		{"2", `"3","4","5" unchanged 1`},
		{"34", `"2","5" unchanged 2`},
		{"2345", ` unchanged 4`},
	} {
		out, n := wire.AppendSnapshotKnown(nil, views, func(v *privacy.View) bool { return strings.Contains(tc.skip, v.UserID) })
		m := decode(t, out)
		users := m["users"].(map[string]any)
		ids := slices.Sorted(maps.Keys(users))
		got := `"` + strings.Join(ids, `","`) + `"`
		if len(ids) == 0 {
			got = ""
		}
		got += fmt.Sprintf(" unchanged %v", m["unchanged"])
		if got != tc.want || n != len(tc.skip) {
			t.Errorf("skip %q: got %s (%d), want %s: %s", tc.skip, got, n, tc.want, out)
		}
	}
}

func TestAppendSnapshot(t *testing.T) {
	for _, tc := range []struct {
		name  string
		views []privacy.View
		want  string
	}{
		{"empty", nil, `{"type":"snapshot","users":{}}`},
		{"one", []privacy.View{full},
			`{"type":"snapshot","users":{"2":{"status":"away","last_seen":"2026-11-22T23:08:49.123Z","status_text":"in a \"meeting\"\n","version":4294967302}}}`},
		{"mixed", []privacy.View{full, noLastSeen, hidden, never},
			`{"type":"snapshot","users":{"2":{"status":"away","last_seen":"2026-11-22T23:08:49.123Z","status_text":"in a \"meeting\"\n","version":4294967302},` +
				`"3":{"status":"online","last_seen":null,"status_text":null,"version":4294967297},` +
				`"4":{"status":null,"last_seen":null,"status_text":null,"version":null},` +
				`"5":{"status":"offline","last_seen":null,"status_text":null,"version":null}}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := wire.AppendSnapshot(nil, tc.views)
			if string(out) != tc.want {
				t.Errorf("got  %s\nwant %s", out, tc.want)
			}
			m := decode(t, out)
			users, ok := m["users"].(map[string]any)
			if m["type"] != "snapshot" || !ok || len(users) != len(tc.views) {
				t.Fatalf("decoded %v", m)
			}
			for _, v := range tc.views {
				u := users[v.UserID].(map[string]any)
				if (u["status"] == nil) == v.StatusVisible {
					t.Errorf("%s: status %v, visible %v", v.UserID, u["status"], v.StatusVisible)
				}
				if (u["last_seen"] == nil) == v.LastSeenVisible {
					t.Errorf("%s: last_seen %v, visible %v", v.UserID, u["last_seen"], v.LastSeenVisible)
				}
			}
		})
	}
}

func TestAppendError(t *testing.T) {
	out := wire.AppendError(nil, "too_many_subscriptions", "at most 500 \"subscriptions\"\u2028")
	want := map[string]any{"type": "error", "code": "too_many_subscriptions", "message": "at most 500 \"subscriptions\"\u2028"}
	if got := decode(t, out); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestAppendRoomError(t *testing.T) {
	out := wire.AppendRoomError(nil, "unavailable", "watch_room", "doc-\"42\"", "retry later")
	want := `{"type":"error","code":"unavailable","request":"watch_room","room":"doc-\"42\"","message":"retry later"}`
	if string(out) != want {
		t.Errorf("got  %s\nwant %s", out, want)
	}
	if out := wire.AppendRoomError(nil, "internal", "join", "", "x"); string(out) != string(wire.AppendError(nil, "internal", "x")) {
		t.Errorf("without a room: %s", out)
	}
}

func TestAppendWelcome(t *testing.T) {
	out := wire.AppendWelcome(nil, "42", "d-7f3a", 7500*time.Millisecond, 30*time.Second, 5*time.Second)
	want := `{"type":"welcome","user_id":"42","device_id":"d-7f3a","heartbeat_interval_ms":7500,"ttl_ms":30000,"close_grace_ms":5000,"subscribe_known":true}`
	if string(out) != want {
		t.Errorf("got  %s\nwant %s", out, want)
	}
	decode(t, out)
}

func TestAppendView(t *testing.T) {
	for _, tc := range []struct {
		v    privacy.View
		want string
	}{
		{full, `{"user_id":"2","status":"away","last_seen":"2026-11-22T23:08:49.123Z","status_text":"in a \"meeting\"\n","devices":2,"version":4294967302}`},
		{hidden, `{"user_id":"4","status":null,"last_seen":null,"status_text":null,"devices":null,"version":null}`},
		{never, `{"user_id":"5","status":"offline","last_seen":null,"status_text":null,"devices":0,"version":null}`},
	} {
		out := wire.AppendView(nil, &tc.v)
		if string(out) != tc.want {
			t.Errorf("got  %s\nwant %s", out, tc.want)
		}
		decode(t, out)
	}
}

func TestTime(t *testing.T) {
	if got := wire.FormatTime(ms); got != "2026-11-22T23:08:49.123Z" {
		t.Errorf("FormatTime = %s", got)
	}
	if got := string(wire.AppendTime(nil, 0)); got != `"1970-01-01T00:00:00.000Z"` {
		t.Errorf("AppendTime(0) = %s", got)
	}
}

// FuzzMessages: whatever the strings of a view hold, every message is valid
// JSON and the strings come back as they were (invalid UTF-8 as U+FFFD).
func FuzzMessages(f *testing.F) {
	f.Add("2", "in a meeting", "code", uint64(1), int64(ms))
	f.Add("\xff\u2028", "\x00\"\\", "", uint64(1<<53), int64(-1))
	f.Fuzz(func(t *testing.T, id, text, code string, version uint64, last int64) {
		v := privacy.View{UserID: id, StatusVisible: true, Status: presence.Busy, Text: text,
			Version: version, LastSeenVisible: true, LastSeen: last}
		for _, out := range [][]byte{
			wire.AppendPresence(nil, &v),
			wire.AppendSnapshot(nil, []privacy.View{v, {UserID: id + "x"}}),
			wire.AppendError(nil, code, text),
			wire.AppendRoomError(nil, code, "leave", id, text),
			wire.AppendWelcome(nil, id, text, time.Duration(last), time.Duration(version), time.Duration(last)),
			wire.AppendView(nil, &v),
		} {
			if !json.Valid(out) {
				t.Fatalf("not valid JSON: %q", out)
			}
		}
		m := decode(t, wire.AppendPresence(nil, &v))
		if m["user_id"] != string([]rune(id)) {
			t.Fatalf("user_id %q came back as %q", id, m["user_id"])
		}
		if text != "" && m["status_text"] != string([]rune(text)) {
			t.Fatalf("status_text %q came back as %q", text, m["status_text"])
		}
	})
}

func FuzzAppendString(f *testing.F) {
	for _, s := range []string{
		"", "a", `"`, `\`, "\n\r\t\b\f", "\x00\x01\x1f\x7f", "é☕𝄞", "\u2028\u2029", "\xff", "a\xc3", "\xed\xa0\x80",
		"<script>&amp;</script>", `{"a":1}`, strings.Repeat("x", 100),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		prefix := []byte("[1,")
		out := wire.AppendString(prefix, s)
		if !bytes.HasPrefix(out, []byte("[1,")) {
			t.Fatalf("prefix lost: %q", out)
		}
		doc := append(out, ']')
		if !json.Valid(doc) {
			t.Fatalf("AppendString(%q) = %q: not valid JSON", s, out[3:])
		}
		var got []any
		if err := json.Unmarshal(doc, &got); err != nil || len(got) != 2 {
			t.Fatalf("decoding %q: %v", doc, err)
		}
		// Valid UTF-8 comes back as it was; each invalid byte as U+FFFD.
		want := string([]rune(s))
		if utf8.ValidString(s) && want != s {
			t.Fatalf("reference broken for %q", s)
		}
		if got[1] != want {
			t.Fatalf("AppendString(%q) decodes to %q, want %q", s, got[1], want)
		}
		// Also safe to embed in JavaScript: no raw U+2028/U+2029, no raw
		// control characters.
		enc := string(out[3:])
		if strings.ContainsAny(enc, "\u2028\u2029") {
			t.Fatalf("raw line separator in %q", enc)
		}
		for i := 0; i < len(enc); i++ {
			if enc[i] < 0x20 {
				t.Fatalf("raw control byte %#x in %q", enc[i], enc)
			}
		}
	})
}

// Times are written as the layout writes them, for any millisecond:
// around the epoch and before it, over leap years and days, at the edges
// of the years written out digit by digit and past them.
func TestAppendTimeAsTheLayout(t *testing.T) {
	check := func(ms int64) {
		t.Helper()
		want := `"` + time.UnixMilli(ms).UTC().Format(wire.TimeLayout) + `"`
		if got := string(wire.AppendTime(nil, ms)); got != want {
			t.Fatalf("AppendTime(%d) = %s, want %s", ms, got, want)
		}
		if got := wire.FormatTime(ms); `"`+got+`"` != want {
			t.Fatalf("FormatTime(%d) = %s, want %s", ms, got, want)
		}
	}
	year0 := time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	year9999 := time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC).UnixMilli()
	for _, ms := range []int64{0, 1, -1, 999, -999, 1000, 951782400000 /* 2000-02-29 */, 1796032802123,
		year0, year0 - 1, year0 + 1, year9999, year9999 + 1, -62135596800000, 253402300800000} {
		check(ms)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 100_000 {
		check(r.Int64N(year9999-year0+2000) + year0 - 1000)
	}
}

func BenchmarkAppendTime(b *testing.B) {
	buf := make([]byte, 0, 64)
	ms := time.Now().UnixMilli()
	for b.Loop() {
		buf = wire.AppendTime(buf[:0], ms)
	}
}
