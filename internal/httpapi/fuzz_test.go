package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/query"
)

// The fuzzers drive every decoder of bytes from the network and assert what
// a success promises: every id passes presence.ValidateID, every status and
// visibility parses, texts fit, lists are bounded and free of duplicates.
// A failure must be a 400 *Error, never anything that would become a 500.

var bodySeeds = []string{
	``, ` `, `null`, `[]`, `"x"`, `0`, `{}`, `{`, `}`, `{} {}`, `{}x`, `{"a":1}`,
	`{"user_id":"1","device_id":"d"}`,
	`{"user_id":"1","device_id":"d","active":false}`,
	`{"user_id":"1","device_id":"d","active":null}`,
	`{"USER_ID":"1","Device_Id":"d"}`,
	`{"user_id":"1","user_id":"2","device_id":"d"}`,
	`{"user_id":"1","device_id":"d","Active":false}`,
	`{"user_id":"cafe\u0301","device_id":"\u212a"}`,
	`{"user_ids":["caf\u00e9","cafe\u0301"]}`,
	`{"user_id":"a b","device_id":"d"}`,
	`{"user_id":"\u0000","device_id":"d"}`,
	`{"user_id":"\ud800","device_id":"d"}`,
	`{"user_id":"` + strings.Repeat("x", 64) + `","device_id":"` + strings.Repeat("y", 65) + `"}`,
	`{"user_id":"1","status":"busy","text":"in a meeting"}`,
	`{"status":"invisible"}`,
	`{"status":"online","text":""}`,
	`{"status":"away","text":null}`,
	`{"status":"Busy"}`,
	`{"status":"busy","text":"` + strings.Repeat("é", 140) + `"}`,
	`{"status":"busy","text":"` + strings.Repeat("é", 141) + `"}`,
	`{"status":"busy","text":"a\u2028b\u0085c"}`,
	`{"status":"busy","text":"a\tb"}`,
	`{"user_ids":["1","2","3"],"viewer_id":"9"}`,
	`{"user_ids":["1","1","2","1"]}`,
	`{"user_ids":[]}`,
	`{"user_ids":null}`,
	`{"user_ids":["1,2"]}`,
	`{"user_ids":["1"],"viewer_id":""}`,
	`{"status_visibility":"everyone","last_seen_visibility":"contacts"}`,
	`{"status_visibility":"nobody","last_seen_visibility":"nobody"}`,
	`{"status_visibility":"friends","last_seen_visibility":"nobody"}`,
	`{"status_visibility":"everyone"}`,
	`{"contacts":["a","b","a"]}`,
	`{"contacts":[]}`,
	`{"contacts":["a",""]}`,
	`{"contacts":[1]}`,
}

func addBodies(f *testing.F, extra ...string) {
	for _, s := range append(bodySeeds, extra...) {
		f.Add([]byte(s))
	}
}

// checkErr asserts that err is a client error.
func checkErr(t *testing.T, err error) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not an *Error: it would be a 500", err, err)
	}
	if e.Status != http.StatusBadRequest || e.Code == "" || e.Message == "" {
		t.Fatalf("error %+v: want a 400 with a code and a message", e)
	}
	if !utf8.ValidString(e.Message) {
		// wire.AppendString would repair it, but a message should be clean.
		t.Logf("message is not valid UTF-8: %q", e.Message)
	}
}

// checkObject asserts that a body that decoded is one JSON object.
func checkObject(t *testing.T, body []byte) {
	t.Helper()
	if !json.Valid(body) {
		t.Fatalf("accepted invalid JSON %q", body)
	}
	if b := bytes.TrimLeft(body, " \t\r\n"); len(b) == 0 || b[0] != '{' {
		t.Fatalf("accepted a body that is not an object: %q", body)
	}
}

func checkOptionalID(t *testing.T, field, id string) {
	t.Helper()
	if id == "" {
		return
	}
	if err := presence.ValidateID(id); err != nil {
		t.Fatalf("accepted %s %q: %v", field, id, err)
	}
}

// checkIDs asserts a decoded id list: 1..max valid, distinct ids.
func checkIDs(t *testing.T, ids []string, minN, maxN int) {
	t.Helper()
	if len(ids) < minN || len(ids) > maxN {
		t.Fatalf("accepted %d ids, want %d to %d", len(ids), minN, maxN)
	}
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if err := presence.ValidateID(id); err != nil {
			t.Fatalf("accepted id %q: %v", id, err)
		}
		if seen[id] {
			t.Fatalf("id %q is repeated in %q", id, ids)
		}
		seen[id] = true
	}
}

// dedupe is the reference: first occurrences, in order.
func dedupe(ids []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

func FuzzDecodeHeartbeat(f *testing.F) {
	addBodies(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := decodeHeartbeat(body)
		if err != nil {
			checkErr(t, err)
			return
		}
		checkObject(t, body)
		checkOptionalID(t, "user_id", r.UserID)
		checkOptionalID(t, "device_id", r.DeviceID)
		// bye reads the same ids: if it accepts the body, it reads them alike.
		if b, err := decodeBye(body); err == nil && (b.UserID != r.UserID || b.DeviceID != r.DeviceID) {
			t.Fatalf("heartbeat read %+v, bye read %+v from %q", r, b, body)
		}
	})
}

func FuzzDecodeStatus(f *testing.F) {
	addBodies(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		r, m, err := decodeStatus(body)
		if err != nil {
			checkErr(t, err)
			return
		}
		checkObject(t, body)
		checkOptionalID(t, "user_id", r.UserID)
		pm, err := presence.ParseManual(r.Status)
		if err != nil || pm != m {
			t.Fatalf("status %q: returned %v, parses as %v, %v", r.Status, m, pm, err)
		}
		if m.String() != r.Status {
			t.Fatalf("status %q round-trips as %q", r.Status, m.String())
		}
		if r.Text != nil {
			txt := *r.Text
			if !utf8.ValidString(txt) || utf8.RuneCountInString(txt) > presence.MaxTextLen {
				t.Fatalf("accepted text %q (%d runes)", txt, utf8.RuneCountInString(txt))
			}
			if err := presence.ValidateText(txt); err != nil {
				t.Fatalf("accepted text %q: %v", txt, err)
			}
		}
	})
}

func FuzzDecodeBatch(f *testing.F) {
	many := make([]string, query.MaxBatch+1)
	for i := range many {
		many[i] = `"` + strings.Repeat("a", i%7+1) + string(rune('0'+i%10)) + `"`
	}
	addBodies(f,
		`{"user_ids":[`+strings.Join(many[:query.MaxBatch], ",")+`]}`,
		`{"user_ids":[`+strings.Join(many, ",")+`]}`,
	)
	sc := new(idScratch) // reused, as the pool reuses it
	f.Fuzz(func(t *testing.T, body []byte) {
		defer sc.reset()
		r, err := decodeBatch(body, sc)
		if err != nil {
			checkErr(t, err)
			return
		}
		checkObject(t, body)
		checkIDs(t, r.UserIDs, 1, query.MaxBatch)
		checkOptionalID(t, "viewer_id", r.ViewerID)
		// The ids are the request's, deduplicated in order.
		var ref batchReq
		if err := json.Unmarshal(body, &ref); err != nil {
			t.Fatalf("decodeBatch accepted what json.Unmarshal refuses: %v", err)
		}
		if want := dedupe(ref.UserIDs); strings.Join(want, "\x00") != strings.Join(r.UserIDs, "\x00") {
			t.Fatalf("ids: got %q, want %q", r.UserIDs, want)
		}
	})
}

func FuzzDecodeSettings(f *testing.F) {
	addBodies(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		s, err := decodeSettings(body)
		if err != nil {
			checkErr(t, err)
			return
		}
		checkObject(t, body)
		for _, v := range []presence.Visibility{s.Status, s.LastSeen} {
			if p, err := presence.ParseVisibility(v.String()); err != nil || p != v {
				t.Fatalf("visibility %d does not round-trip: %v", v, err)
			}
		}
		var ref settingsReq
		if err := json.Unmarshal(body, &ref); err != nil || ref.StatusVisibility == nil || ref.LastSeenVisibility == nil {
			t.Fatalf("accepted %q: %v", body, err)
		}
		if *ref.StatusVisibility != s.Status.String() || *ref.LastSeenVisibility != s.LastSeen.String() {
			t.Fatalf("got %+v from %q", s, body)
		}
	})
}

func FuzzDecodeContacts(f *testing.F) {
	addBodies(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		list, err := decodeContacts(body)
		if err != nil {
			checkErr(t, err)
			return
		}
		checkObject(t, body)
		if list == nil {
			t.Fatalf("accepted %q as a nil list", body)
		}
		checkIDs(t, list, 0, presence.MaxContacts)
		var ref contactsReq
		if err := json.Unmarshal(body, &ref); err != nil {
			t.Fatalf("accepted what json.Unmarshal refuses: %v", err)
		}
		if want := dedupe(ref.Contacts); strings.Join(want, "\x00") != strings.Join(list, "\x00") {
			t.Fatalf("contacts: got %q, want %q", list, want)
		}
	})
}

func FuzzParseIDList(f *testing.F) {
	for _, s := range []string{
		"", ",", "1", "1,2,3", "1,,2", "1,2,", ",1", "1,1,1", "a b", "a\x00", "\xff", "é,ü,☕",
		strings.Repeat("x", 64), strings.Repeat("x", 65), strings.Repeat("1,", 999) + "1", strings.Repeat("1,", 1000) + "1",
		strings.Repeat(",", 1000),
	} {
		f.Add(s)
	}
	sc := new(idScratch) // reused, as the pool reuses it
	f.Fuzz(func(t *testing.T, s string) {
		defer sc.reset()
		ids, err := parseIDList("user_ids", s, sc)
		if err != nil {
			checkErr(t, err)
			return
		}
		checkIDs(t, ids, 1, query.MaxBatch)
		if want := dedupe(strings.Split(s, ",")); strings.Join(want, ",") != strings.Join(ids, ",") {
			t.Fatalf("parseIDList(%q) = %q, want %q", s, ids, want)
		}
	})
}

// BenchmarkDecodeBatch1000 decodes the body of a batch read of 1,000 ids,
// the exact-key check included (it walks the body once more).
func BenchmarkDecodeBatch1000(b *testing.B) {
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = strconv.Itoa(100000000 + i*7919)
	}
	body, _ := json.Marshal(map[string]any{"user_ids": ids, "viewer_id": "42"})
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		sc := getIDScratch()
		if _, err := decodeBatch(body, sc); err != nil {
			b.Fatal(err)
		}
		putIDScratch(sc)
	}
}
