package httpapi_test

import (
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/httpapi"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/ratelimit"
)

// roomToken signs a client token for user (bound to device, if not
// empty) whose rooms claim is rooms.
func (e *env) roomToken(user, device string, rooms ...string) string {
	e.t.Helper()
	tok, err := auth.Token{User: user, Device: device, Rooms: rooms}.Sign(secret, e.clk.Now(), time.Hour)
	if err != nil {
		e.t.Fatalf("Sign: %v", err)
	}
	return "Bearer " + tok
}

// roomAnswer is the answer of a join or leave.
type roomAnswer struct {
	Room    string `json:"room"`
	Count   int    `json:"count"`
	Version uint64 `json:"version"`
}

func (e *env) roomOp(op, room, authz, user, device string) roomAnswer {
	e.t.Helper()
	r := e.ok("POST", "/v1/rooms/"+room+"/"+op, authz, `{"user_id":`+jstr(user)+`,"device_id":`+jstr(device)+`}`)
	var a roomAnswer
	decodeStrict(e.t, r.body, &a)
	if a.Room != room {
		e.t.Fatalf("%s %s: answer names room %q", op, room, a.Room)
	}
	return a
}

// roomPage is the answer of GET /v1/rooms/{room}.
type roomPage struct {
	Room    string             `json:"room"`
	Count   int                `json:"count"`
	Members map[string]*string `json:"members"`
	Next    *string            `json:"next"`
	Version uint64             `json:"version"`
}

func (e *env) room(path, authz string) roomPage {
	e.t.Helper()
	r := e.ok("GET", path, authz, "")
	var p roomPage
	decodeStrict(e.t, r.body, &p)
	return p
}

// TestRoomJoinLeave: a join or leave answers the room after it; a second
// device of a member changes nothing, and neither does a leave of a room
// the device is not in.
func TestRoomJoinLeave(t *testing.T) {
	e := newEnv(t, opts{})
	e.beat("alice", "d1", true)
	e.beat("alice", "d2", true)
	e.beat("bob", "d", true)

	r := e.ok("POST", "/v1/rooms/doc-42/join", keyHdr, `{"user_id":"alice","device_id":"d1"}`)
	var first roomAnswer
	decodeStrict(t, r.body, &first)
	if got, want := string(r.body), `{"room":"doc-42","count":1,"version":`+strconv.FormatUint(first.Version, 10)+"}\n"; got != want || first.Version == 0 {
		t.Fatalf("first join: got %q, want %q with a version", got, want)
	}
	if ct, cc := r.header.Get("Content-Type"), r.header.Get("Cache-Control"); ct != "application/json" || cc != "no-store" {
		t.Errorf("headers: Content-Type %q, Cache-Control %q", ct, cc)
	}
	v1 := first.Version
	steps := []struct {
		op, user, dev string
		count         int
		changed       bool
	}{
		{"join", "bob", "d", 2, true},
		{"join", "alice", "d1", 2, false},  // again
		{"join", "alice", "d2", 2, false},  // alice is a member already
		{"leave", "alice", "d1", 2, false}, // d2 is still in
		{"leave", "alice", "d2", 1, true},
		{"leave", "alice", "d2", 1, false}, // not in it
	}
	last := v1
	for _, s := range steps {
		a := e.roomOp(s.op, "doc-42", keyHdr, s.user, s.dev)
		if a.Count != s.count || (a.Version > last) != s.changed || a.Version < last {
			t.Errorf("%s %s/%s: count %d version %d (was %d), want count %d, changed %v", s.op, s.user, s.dev, a.Count, a.Version, last, s.count, s.changed)
		}
		last = a.Version
	}
	if p := e.room("/v1/rooms/doc-42", keyHdr); p.Count != 1 || len(p.Members) != 1 || p.Members["bob"] == nil || *p.Members["bob"] != "online" || p.Version != last {
		t.Errorf("the room after: %+v", p)
	}

	// A bye ends the device and its rooms.
	e.ok("POST", "/v1/bye", keyHdr, `{"user_id":"bob","device_id":"d"}`)
	if p := e.room("/v1/rooms/doc-42", keyHdr); p.Count != 0 || len(p.Members) != 0 || p.Next != nil {
		t.Errorf("after bob's bye: %+v", p)
	}
}

// TestRoomJoinErrors: every refusal of a join, which changes nothing.
func TestRoomJoinErrors(t *testing.T) {
	e := newEnv(t, opts{})
	e.beat("alice", "d", true)
	long := strings.Repeat("x", presence.MaxIDLen+1)
	for _, tc := range []struct {
		name, path, body string
		code             int
		errCode          string
		words            []string
	}{
		{"device never beat", "/v1/rooms/r/join", `{"user_id":"alice","device_id":"other"}`, 409, "device_not_alive", []string{"heartbeat"}},
		{"user never seen", "/v1/rooms/r/join", `{"user_id":"nobody","device_id":"d"}`, 409, "device_not_alive", nil},
		{"room with a comma", "/v1/rooms/a,b/join", `{"user_id":"alice","device_id":"d"}`, 400, "invalid_id", []string{"room"}},
		{"room too long", "/v1/rooms/" + long + "/leave", `{"user_id":"alice","device_id":"d"}`, 400, "invalid_id", []string{"room"}},
		{"no user", "/v1/rooms/r/join", `{"device_id":"d"}`, 400, "invalid_id", nil},
		{"no device", "/v1/rooms/r/join", `{"user_id":"alice"}`, 400, "invalid_id", []string{"device_id"}},
		{"bad device", "/v1/rooms/r/join", `{"user_id":"alice","device_id":"a b"}`, 400, "invalid_id", []string{"device_id"}},
		{"unknown field", "/v1/rooms/r/join", `{"user_id":"alice","device_id":"d","room":"r"}`, 400, "invalid_json", nil},
		{"no body", "/v1/rooms/r/leave", ``, 400, "invalid_json", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, e.do("POST", tc.path, keyHdr, tc.body), tc.code, tc.errCode, tc.words...)
		})
	}
	wantError(t, e.do("POST", "/v1/rooms/r/join", "", `{"user_id":"alice","device_id":"d"}`), 401, "unauthorized")
	if p := e.room("/v1/rooms/r", keyHdr); p.Count != 0 {
		t.Errorf("a refused join changed the room: %+v", p)
	}

	// A device in as many rooms as it may be is refused one more.
	for i := range presence.DefaultMaxRooms {
		e.roomOp("join", "r"+strconv.Itoa(i), keyHdr, "alice", "d")
	}
	wantError(t, e.do("POST", "/v1/rooms/one-more/join", keyHdr, `{"user_id":"alice","device_id":"d"}`), 409, "too_many_rooms")
	if r := e.ok("GET", "/v1/rooms?ids=one-more,r0", keyHdr, ""); string(r.body) != `{"one-more":0,"r0":1}`+"\n" {
		t.Errorf("counts after the refusal: %s", r.body)
	}
	// Another device of the user has rooms of its own.
	e.beat("alice", "d2", true)
	e.roomOp("join", "one-more", keyHdr, "alice", "d2")
}

// TestRoomClientToken: a client acts for its own user and device, in the
// rooms its token's claim allows, and is limited per device.
func TestRoomClientToken(t *testing.T) {
	e := newEnv(t, opts{})
	e.beat("alice", "d", true)
	e.beat("alice", "d2", true)
	tok := e.roomToken("alice", "d", "doc-*", "lobby")

	if a := e.roomOp("join", "doc-1", tok, "", ""); a.Count != 1 {
		t.Errorf("join of doc-1: %+v", a)
	}
	e.roomOp("join", "lobby", tok, "alice", "d")
	for _, tc := range []struct {
		name, room, authz, body string
		code                    int
		errCode                 string
	}{
		{"room outside the claim", "lobby2", tok, `{}`, 403, "room_not_allowed"},
		{"token without rooms", "doc-1", e.token("alice", "d"), `{}`, 403, "room_not_allowed"},
		{"another user", "doc-1", tok, `{"user_id":"bob"}`, 403, "forbidden"},
		{"another device", "doc-1", tok, `{"device_id":"d2"}`, 403, "forbidden"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, e.do("POST", "/v1/rooms/"+tc.room+"/join", tc.authz, tc.body), tc.code, tc.errCode)
		})
	}

	// ratelimit.Rooms: a burst of 200 joins and leaves per device, then
	// 429 with Retry-After; another device has its own bucket, the API
	// key none.
	ops := 2 // the joins above
	for ; ops < 200; ops++ {
		op := "leave"
		if ops%2 == 1 {
			op = "join"
		}
		e.roomOp(op, "doc-1", tok, "", "")
	}
	r := e.do("POST", "/v1/rooms/doc-1/leave", tok, `{}`)
	wantError(t, r, 429, "rate_limited", "rooms")
	if ra := r.header.Get("Retry-After"); ra != "1" {
		t.Errorf("Retry-After %q, want 1", ra)
	}
	e.roomOp("join", "doc-2", e.roomToken("alice", "d2", "*"), "", "")
	e.roomOp("join", "doc-3", keyHdr, "alice", "d")
	e.clk.Advance(100 * time.Millisecond)
	e.roomOp("leave", "doc-1", tok, "", "")
}

// TestRoomDev: under -dev a request without credentials acts for the
// user it names, in every room.
func TestRoomDev(t *testing.T) {
	e := newEnv(t, opts{dev: true})
	e.ok("POST", "/v1/heartbeat", "", `{"user_id":"alice","device_id":"d"}`)
	if a := e.roomOp("join", "any", "", "alice", "d"); a.Count != 1 {
		t.Errorf("join: %+v", a)
	}
	if p := e.room("/v1/rooms/any", ""); p.Count != 1 || p.Members["alice"] == nil {
		t.Errorf("read: %+v", p)
	}
}

// TestRoomRead: each member's status as the viewer may see it (null when
// hidden), an invisible member neither listed nor counted.
func TestRoomRead(t *testing.T) {
	e := newEnv(t, opts{})
	for _, u := range []string{"alice", "bob", "carol", "dave", "eve"} {
		e.beat(u, "d", true)
		e.roomOp("join", "r", keyHdr, u, "d")
	}
	e.setSettings("bob", "contacts", "contacts")
	e.setContacts("bob", "carol")
	e.setSettings("dave", "nobody", "nobody")
	e.setStatus("bob", "busy", "")
	e.setStatus("eve", "invisible", "")

	show := func(m map[string]*string) map[string]string {
		out := map[string]string{}
		for k, v := range m {
			out[k] = "null"
			if v != nil {
				out[k] = *v
			}
		}
		return out
	}
	stranger := map[string]string{"alice": "online", "bob": "null", "carol": "online", "dave": "null"}
	for _, tc := range []struct {
		name, path, authz string
		want              map[string]string
	}{
		{"API key, no viewer: a stranger's view", "/v1/rooms/r", keyHdr, stranger},
		{"API key as a stranger", "/v1/rooms/r?viewer_id=zed", keyHdr, stranger},
		{"API key as bob's contact", "/v1/rooms/r?viewer_id=carol", keyHdr,
			map[string]string{"alice": "online", "bob": "busy", "carol": "online", "dave": "null"}},
		{"API key as dave", "/v1/rooms/r?viewer_id=dave", keyHdr,
			map[string]string{"alice": "online", "bob": "null", "carol": "online", "dave": "online"}},
		{"client carol", "/v1/rooms/r", e.roomToken("carol", "", "r"),
			map[string]string{"alice": "online", "bob": "busy", "carol": "online", "dave": "null"}},
		{"client dave", "/v1/rooms/r", e.roomToken("dave", "", "*"),
			map[string]string{"alice": "online", "bob": "null", "carol": "online", "dave": "online"}},
		{"client eve, invisible", "/v1/rooms/r", e.roomToken("eve", "", "r"), stranger},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := e.room(tc.path, tc.authz)
			got := show(p.Members)
			if p.Room != "r" || p.Count != 4 || p.Next != nil || len(got) != len(tc.want) {
				t.Errorf("room %q count %d next %v members %v", p.Room, p.Count, p.Next, got)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s: got %s, want %s", k, got[k], v)
				}
			}
		})
	}
	// The exact bytes of a page.
	r := e.ok("GET", "/v1/rooms/r?viewer_id=carol&limit=1000", keyHdr, "")
	if !strings.HasPrefix(string(r.body), `{"room":"r","count":4,"members":{`) || !strings.HasSuffix(string(r.body), `},"next":null,"version":`+strconv.FormatUint(e.room("/v1/rooms/r", keyHdr).Version, 10)+"}\n") ||
		!strings.Contains(string(r.body), `"bob":"busy"`) || !strings.Contains(string(r.body), `"dave":null`) {
		t.Errorf("body %s", r.body)
	}

	// A client reads only rooms its claim allows, as its own user.
	wantError(t, e.do("GET", "/v1/rooms/r", e.roomToken("carol", "", "s"), ""), 403, "room_not_allowed")
	wantError(t, e.do("GET", "/v1/rooms/r", e.token("carol", ""), ""), 403, "room_not_allowed")
	wantError(t, e.do("GET", "/v1/rooms/r?viewer_id=bob", e.roomToken("carol", "", "r"), ""), 403, "forbidden")
}

// TestRoomPages: limit and after page through the members; limit is 1
// to 1,000 (default 100).
func TestRoomPages(t *testing.T) {
	e := newEnv(t, opts{})
	var want []string
	for i := range 150 {
		u := "u" + strconv.Itoa(i)
		e.beat(u, "d", true)
		e.roomOp("join", "big", keyHdr, u, "d")
		want = append(want, u)
	}
	p := e.room("/v1/rooms/big", keyHdr)
	if p.Count != 150 || len(p.Members) != 100 || p.Next == nil {
		t.Fatalf("default page: count %d, %d members, next %v", p.Count, len(p.Members), p.Next)
	}
	seen := map[string]bool{}
	after := ""
	for pages := 1; ; pages++ {
		p := e.room("/v1/rooms/big?limit=40&after="+after, keyHdr)
		if len(p.Members) > 40 || p.Count != 150 {
			t.Fatalf("page %d: %d members, count %d", pages, len(p.Members), p.Count)
		}
		for u := range p.Members {
			if seen[u] {
				t.Fatalf("%s on two pages", u)
			}
			seen[u] = true
		}
		if p.Next == nil {
			if pages != 4 {
				t.Errorf("%d pages of 40 for 150 members, want 4", pages)
			}
			break
		}
		if p.Members[*p.Next] == nil {
			t.Fatalf("page %d: next %q is not on it", pages, *p.Next)
		}
		after = *p.Next
	}
	for _, u := range want {
		if !seen[u] {
			t.Errorf("%s was on no page", u)
		}
	}
	for _, tc := range []struct{ query, errCode string }{
		{"limit=0", "invalid_query"},
		{"limit=1001", "invalid_query"},
		{"limit=-1", "invalid_query"},
		{"limit=ten", "invalid_query"},
		{"limit=1&limit=2", "invalid_query"},
		{"after=a,b", "invalid_id"},
		{"viewer_id=a,b", "invalid_id"},
	} {
		wantError(t, e.do("GET", "/v1/rooms/big?"+tc.query, keyHdr, ""), 400, tc.errCode)
	}
	if p := e.room("/v1/rooms/big?limit=1000", keyHdr); len(p.Members) != 150 || p.Next != nil {
		t.Errorf("limit=1000: %d members, next %v", len(p.Members), p.Next)
	}
}

// TestRoomCounts: the counts of many rooms at once, 1 to 1,000 of them.
func TestRoomCounts(t *testing.T) {
	e := newEnv(t, opts{})
	e.beat("alice", "d", true)
	e.beat("bob", "d", true)
	e.roomOp("join", "a", keyHdr, "alice", "d")
	e.roomOp("join", "a", keyHdr, "bob", "d")
	e.roomOp("join", "b", keyHdr, "bob", "d")
	r := e.ok("GET", "/v1/rooms?ids=b,a,c,a", keyHdr, "")
	if got, want := string(r.body), `{"b":1,"a":2,"c":0}`+"\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	// Invisible: counted nowhere.
	e.setStatus("bob", "invisible", "")
	if r := e.ok("GET", "/v1/rooms?ids=a,b", keyHdr, ""); string(r.body) != `{"a":1,"b":0}`+"\n" {
		t.Errorf("bob invisible: %s", r.body)
	}
	ids := make([]string, 1001)
	for i := range ids {
		ids[i] = "r" + strconv.Itoa(i)
	}
	if r := e.ok("GET", "/v1/rooms?ids="+strings.Join(ids[:1000], ","), keyHdr, ""); !strings.HasPrefix(string(r.body), `{"r0":0,`) {
		t.Errorf("1000 ids: %.40s", r.body)
	}
	for _, tc := range []struct{ query, errCode string }{
		{"", "invalid_ids"},
		{"ids=", "invalid_ids"},
		{"ids=" + strings.Join(ids, ","), "too_many_ids"},
		{"ids=a,,b", "invalid_id"},
		{"ids=a&ids=b", "invalid_query"},
	} {
		wantError(t, e.do("GET", "/v1/rooms?"+tc.query, keyHdr, ""), 400, tc.errCode, "ids")
	}
	// A client asks for the rooms its claim allows.
	tok := e.roomToken("carol", "", "a", "b")
	if r := e.ok("GET", "/v1/rooms?ids=a,b", tok, ""); string(r.body) != `{"a":1,"b":0}`+"\n" {
		t.Errorf("client: %s", r.body)
	}
	wantError(t, e.do("GET", "/v1/rooms?ids=a,c", tok, ""), 403, "room_not_allowed", `"c"`)
}

// TestRoomPollThrottle: a client's reads of rooms take the poll
// throttle's token, as its reads of presence do.
func TestRoomPollThrottle(t *testing.T) {
	e := newEnv(t, opts{poll: 30 * time.Second})
	tok := e.roomToken("carol", "", "*")
	e.ok("GET", "/v1/rooms/r", tok, "")
	r := e.do("GET", "/v1/rooms?ids=r", tok, "")
	wantError(t, r, 429, "rate_limited")
	if r.header.Get("Retry-After") != "30" {
		t.Errorf("Retry-After %q", r.header.Get("Retry-After"))
	}
	e.ok("GET", "/v1/rooms?ids=r", keyHdr, "") // the API key is not throttled
	e.clk.Advance(30 * time.Second)
	e.ok("GET", "/v1/rooms?ids=r", tok, "")
}

// TestRoomPagesThrottle: a client reads a room's further pages (after=)
// without waiting a poll interval between them, up to their own limit.
func TestRoomPagesThrottle(t *testing.T) {
	e := newEnv(t, opts{poll: 30 * time.Second})
	tok := e.roomToken("carol", "", "*")
	e.ok("GET", "/v1/rooms/r", tok, "")
	wantError(t, e.do("GET", "/v1/rooms/r", tok, ""), 429, "rate_limited") // a first page again: a poll
	for i := range ratelimit.RoomPages.Burst {
		if r := e.do("GET", "/v1/rooms/r?after=m"+strconv.Itoa(i), tok, ""); r.code != 200 {
			t.Fatalf("page %d: %d %s", i+2, r.code, r.body)
		}
	}
	r := e.do("GET", "/v1/rooms/r?after=z", tok, "")
	wantError(t, r, 429, "rate_limited", "further pages")
	if r.header.Get("Retry-After") != "1" {
		t.Errorf("Retry-After %q", r.header.Get("Retry-After"))
	}
	wantError(t, e.do("GET", "/v1/rooms/r?after=z&viewer_id=dave", tok, ""), 403, "")
	e.clk.Advance(ratelimit.RoomPages.Every)
	e.ok("GET", "/v1/rooms/r?after=z", tok, "")
}

// TestRoomsUnavailable: a node whose tracker or reader has no rooms
// answers 501 rooms_unavailable, without Retry-After (no retry helps).
func TestRoomsUnavailable(t *testing.T) {
	var d deps
	srv, err := httpapi.New(httpapi.Config{Tracker: d, Reader: d, Contacts: d, Profiles: d, Auth: auth.New(auth.Config{APIKey: apiKey})})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/v1/rooms/r/join", `{"user_id":"alice","device_id":"d"}`},
		{"POST", "/v1/rooms/r/leave", `{"user_id":"alice","device_id":"d"}`},
		{"GET", "/v1/rooms/r", ""},
		{"GET", "/v1/rooms?ids=r", ""},
	} {
		w := httptest.NewRecorder()
		req := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body))
		req.Header.Set("Authorization", keyHdr)
		srv.ServeHTTP(w, req)
		wantError(t, &resp{code: w.Code, header: w.Header(), body: w.Body.Bytes()}, 501, "rooms_unavailable", "state store")
		if ra := w.Header().Get("Retry-After"); ra != "" {
			t.Errorf("%s %s: Retry-After %q", tc.method, tc.path, ra)
		}
	}
}
