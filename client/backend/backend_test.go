package backend_test

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/client/backend"
	"github.com/presenced/presenced/internal/apicontract"
	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/app/apptest"
	"github.com/presenced/presenced/internal/testsvc"
)

// The package is checked against the API description end to end: a real
// node runs in the test, and every request the package sends and every
// answer it decodes goes through apicontract.Transport, which fails the
// call unless its method and path are an operation of the description,
// its body is valid for it, and the answer is a documented one.

const testKey = "backend-test-api-key-0123456789abcdef"

var testSecret = []byte("backend-test-jwt-secret-0123456789abcdef")

// runNode runs a whole node on 127.0.0.1 until the end of the test.
func runNode(t *testing.T, cfg app.Config) string {
	t.Helper()
	return "http://" + apptest.Run(t, cfg)
}

func loadContract(t *testing.T) *apicontract.Contract {
	t.Helper()
	c, err := apicontract.Load()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// newClient returns a Client of the node at base whose every exchange is
// checked against the description (requests too, unless loose: calls the
// test makes invalid on purpose).
func newClient(t *testing.T, c *apicontract.Contract, base, key string, loose bool) *backend.Client {
	t.Helper()
	b, err := backend.New(backend.Config{URL: base + "/", APIKey: key,
		HTTPClient: &http.Client{Transport: &apicontract.Transport{Contract: c, AllowInvalidRequests: loose}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func must[T any](t *testing.T, what string) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return v
	}
}

// val is *p, or the zero value for nil.
func val[T any](p *T) T {
	var z T
	if p == nil {
		return z
	}
	return *p
}

func status(s *backend.Status) string {
	if s == nil {
		return "null"
	}
	return string(*s)
}

// wantError checks that err is an *Error with the status and code.
func wantError(t *testing.T, what string, err error, code int, errCode string) *backend.Error {
	t.Helper()
	var e *backend.Error
	if !errors.As(err, &e) {
		t.Fatalf("%s: got %v, want a *backend.Error %d %s", what, err, code, errCode)
	}
	if e.Status != code || e.Code != errCode || e.Message == "" {
		t.Fatalf("%s: got %+v, want %d %s with a message", what, e, code, errCode)
	}
	return e
}

func TestBackendAgainstANode(t *testing.T) {
	c := loadContract(t)
	base := runNode(t, app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret})
	b := newClient(t, c, base, testKey, false)
	ctx := t.Context()

	// Every exported method of Client is called below: a method added
	// without a call here fails the test.
	called := map[string]bool{}
	call := func(name string) { called[name] = true }

	call("Heartbeat")
	v := must[backend.SelfView](t, "Heartbeat")(b.Heartbeat(ctx, "alice", "phone", true))
	if status(v.Status) != "online" || v.DeviceID != "phone" || val(v.Devices) != 1 || v.TTL() != 30*time.Second ||
		v.HeartbeatInterval() != v.TTL()/4 || v.LastSeen == nil || v.Version == nil {
		t.Errorf("Heartbeat: %+v", v)
	}
	call("SetStatus")
	v = must[backend.SelfView](t, "SetStatus")(b.SetStatus(ctx, "alice", backend.Busy, "in a meeting"))
	if status(v.Status) != "busy" || val(v.StatusText) != "in a meeting" || v.DeviceID != "" {
		t.Errorf("SetStatus: %+v", v)
	}
	call("SetSettings")
	want := backend.Settings{Status: backend.Contacts, LastSeen: backend.Nobody}
	if s := must[backend.Settings](t, "SetSettings")(b.SetSettings(ctx, "alice", want)); s != want {
		t.Errorf("SetSettings: got %+v, want %+v", s, want)
	}
	call("Settings")
	if s := must[backend.Settings](t, "Settings")(b.Settings(ctx, "alice")); s != want {
		t.Errorf("Settings: got %+v, want %+v", s, want)
	}
	sorted := func(l []string) []string { l = slices.Clone(l); slices.Sort(l); return l }
	wantList := func(what string, got []string, want ...string) {
		t.Helper()
		if !slices.Equal(sorted(got), want) {
			t.Errorf("%s: got %q, want %q", what, got, want)
		}
	}
	call("SetContacts")
	wantList("SetContacts", must[[]string](t, "SetContacts")(b.SetContacts(ctx, "alice", []string{"bob", "carol", "bob"})), "bob", "carol")
	call("AddContacts")
	wantList("AddContacts", must[[]string](t, "AddContacts")(b.AddContacts(ctx, "alice", "dave")), "bob", "carol", "dave")
	call("AddContact")
	wantList("AddContact", must[[]string](t, "AddContact")(b.AddContact(ctx, "alice", "erin")), "bob", "carol", "dave", "erin")
	call("RemoveContact")
	wantList("RemoveContact", must[[]string](t, "RemoveContact")(b.RemoveContact(ctx, "alice", "carol")), "bob", "dave", "erin")
	call("Contacts")
	wantList("Contacts", must[[]string](t, "Contacts")(b.Contacts(ctx, "alice")), "bob", "dave", "erin")
	wantList("Contacts of nobody", must[[]string](t, "Contacts")(b.Contacts(ctx, "nobody")))

	// Reads: bob is a contact of alice's, zed is not.
	call("Presence")
	if p := must[backend.View](t, "Presence")(b.Presence(ctx, "alice", "bob")); status(p.Status) != "busy" || p.LastSeen != nil || val(p.StatusText) != "in a meeting" {
		t.Errorf("Presence as bob: %+v", p)
	}
	if p := must[backend.View](t, "Presence")(b.Presence(ctx, "alice", "zed")); p.Status != nil || p.StatusText != nil || p.Devices != nil || p.UserID != "alice" {
		t.Errorf("Presence as zed: %+v", p)
	}
	call("Batch")
	views := must[map[string]backend.View](t, "Batch")(b.Batch(ctx, []string{"alice", "ghost", "alice"}, "bob"))
	if len(views) != 2 || status(views["alice"].Status) != "busy" || status(views["ghost"].Status) != "offline" || views["ghost"].LastSeen != nil {
		t.Errorf("Batch: %+v", views)
	}
	call("Statuses")
	st := must[map[string]*backend.Status](t, "Statuses")(b.Statuses(ctx, []string{"alice", "ghost"}, "bob"))
	if len(st) != 2 || status(st["alice"]) != "busy" || status(st["ghost"]) != "offline" {
		t.Errorf("Statuses as bob: %v", st)
	}
	st = must[map[string]*backend.Status](t, "Statuses")(b.Statuses(ctx, []string{"alice"}, ""))
	if s, ok := st["alice"]; !ok || s != nil {
		t.Errorf("Statuses as nobody: %v, want alice hidden", st)
	}
	// 1,000 ids of 31 bytes fit in the request line (the commas stay
	// literal).
	many := make([]string, 1000)
	for i := range many {
		many[i] = fmt.Sprintf("%031d", i)
	}
	if st := must[map[string]*backend.Status](t, "Statuses of 1,000")(b.Statuses(ctx, many, "")); len(st) != 1000 {
		t.Errorf("Statuses of 1,000 ids: %d answers", len(st))
	}
	call("Public")
	if p := must[backend.View](t, "Public")(b.Public(ctx, "alice")); p.Status != nil || p.UserID != "alice" {
		t.Errorf("Public: %+v", p)
	}
	call("Debug")
	d := must[backend.DebugUser](t, "Debug")(b.Debug(ctx, "alice"))
	if !d.Known || !d.InMemory || len(d.Devices) != 1 || d.Devices[0].DeviceID != "phone" || !d.Devices[0].Alive ||
		d.ManualStatus == nil || *d.ManualStatus != backend.Busy || d.Settings != want || d.Rules.TTLMillis != 30000 || d.Reason == "" || d.Now.IsZero() {
		t.Errorf("Debug: %+v", d)
	}
	call("DebugAs")
	for _, tc := range []struct{ viewer, relation, status string }{
		{"bob", "contact", "busy"}, {"zed", "other", "null"}, {"alice", "self", "busy"},
	} {
		d := must[backend.DebugUser](t, "DebugAs")(b.DebugAs(ctx, "alice", tc.viewer))
		if d.UserID != "alice" || d.Viewer == nil || d.Viewer.ViewerID != tc.viewer || d.Viewer.Relation != tc.relation ||
			status(d.Viewer.Sees.Status) != tc.status || d.Viewer.Sees.UserID != "alice" || d.Viewer.Why == "" {
			t.Errorf("DebugAs %s: %+v", tc.viewer, d.Viewer)
		}
	}
	if d := must[backend.DebugUser](t, "DebugAs")(b.DebugAs(ctx, "alice", "")); d.Viewer != nil || d.UserID != "alice" {
		t.Errorf("DebugAs without a viewer: %+v", d.Viewer)
	}
	if d.Viewer != nil {
		t.Errorf("Debug: a viewer part %+v", d.Viewer)
	}
	call("AdminStats")
	stats := must[backend.AdminStats](t, "AdminStats")(b.AdminStats(ctx))
	// (Ready once its gateway runs, which Run starts next to serving.)
	if n := stats.Nodes; len(n) != 1 || !n[0].Self || (n[0].Health != "ready" && n[0].Health != "not_ready") || n[0].Mode != "embedded" ||
		n[0].Checks["sqlite"] != "ok" || n[0].Started == nil || stats.Now.UnixMilli() != stats.NowMs ||
		stats.Metrics["presenced_heartbeats_total"] < 1 {
		t.Errorf("AdminStats: %+v", stats)
	}
	// Rooms: alice (contacts only, busy) and bob are in doc-42.
	must[backend.SelfView](t, "Heartbeat")(b.Heartbeat(ctx, "bob", "laptop", true))
	call("Join")
	if r := must[backend.Room](t, "Join")(b.Join(ctx, "doc-42", "alice", "phone")); r.Room != "doc-42" || r.Count != 1 || r.Version == 0 {
		t.Errorf("Join: %+v", r)
	}
	r := must[backend.Room](t, "Join")(b.Join(ctx, "doc-42", "bob", "laptop"))
	if r.Count != 2 {
		t.Errorf("Join of bob: %+v", r)
	}
	call("Room")
	page := must[backend.RoomPage](t, "Room")(b.Room(ctx, "doc-42", "", 0, "zed"))
	if page.Room != "doc-42" || page.Count != 2 || len(page.Members) != 2 || page.Members["alice"] != nil || status(page.Members["bob"]) != "online" ||
		page.Next != "" || page.Version != r.Version {
		t.Errorf("Room as zed: %+v", page)
	}
	first := must[backend.RoomPage](t, "Room")(b.Room(ctx, "doc-42", "", 1, "bob"))
	if _, ok := first.Members[first.Next]; len(first.Members) != 1 || !ok {
		t.Errorf("Room, a page of 1 as bob: %+v", first)
	}
	second := must[backend.RoomPage](t, "Room")(b.Room(ctx, "doc-42", first.Next, 1, "bob"))
	if len(second.Members) != 1 || second.Next != "" {
		t.Errorf("Room, the second page: %+v", second)
	}
	for u, s := range second.Members {
		if _, dup := first.Members[u]; dup || (u == "alice" && status(s) != "busy") {
			t.Errorf("Room pages as bob: %+v, %+v", first.Members, second.Members)
		}
	}
	call("Leave")
	if r := must[backend.Room](t, "Leave")(b.Leave(ctx, "doc-42", "bob", "laptop")); r.Count != 1 {
		t.Errorf("Leave: %+v", r)
	}
	call("RoomCounts")
	if n := must[map[string]int](t, "RoomCounts")(b.RoomCounts(ctx, []string{"doc-42", "empty"})); len(n) != 2 || n["doc-42"] != 1 || n["empty"] != 0 {
		t.Errorf("RoomCounts: %v", n)
	}

	call("Bye")
	v = must[backend.SelfView](t, "Bye")(b.Bye(ctx, "alice", "phone"))
	if val(v.Devices) != 0 || v.DeviceID != "phone" {
		t.Errorf("Bye: %+v", v)
	}

	tc := reflect.TypeFor[*backend.Client]()
	for i := range tc.NumMethod() {
		if m := tc.Method(i).Name; !called[m] {
			t.Errorf("Client.%s is not exercised against the node", m)
		}
	}

	// Refusals are *Error values, checked against the description too.
	loose := newClient(t, c, base, testKey, true)
	_, err := loose.Presence(ctx, "a b", "")
	wantError(t, "Presence of an invalid id", err, 400, "invalid_id")
	_, err = loose.Batch(ctx, nil, "")
	wantError(t, "Batch of no ids", err, 400, "invalid_ids")
	_, err = loose.SetStatus(ctx, "alice", backend.Offline, "")
	wantError(t, "SetStatus offline", err, 400, "invalid_status")
	_, err = loose.SetContacts(ctx, "alice", make([]string, 10001))
	wantError(t, "SetContacts of 10,001", err, 400, "too_many_contacts")
	_, err = loose.DebugAs(ctx, "alice", "a b")
	wantError(t, "DebugAs an invalid viewer", err, 400, "invalid_id")
	_, err = newClient(t, c, base, "", false).AdminStats(ctx)
	wantError(t, "AdminStats without the key", err, 401, "unauthorized")
	_, err = newClient(t, c, base, "not-the-key", false).Contacts(ctx, "alice")
	e := wantError(t, "Contacts with a wrong key", err, 401, "unauthorized")
	if e.Temporary() || e.RetryAfter != 0 {
		t.Errorf("a 401 is not temporary: %+v", e)
	}
	if _, err := b.Statuses(ctx, []string{"a,b"}, ""); err == nil || errors.As(err, &e) {
		t.Errorf("Statuses of an id with a comma: got %v, want a local error", err)
	}
	_, err = loose.Join(ctx, "doc-42", "alice", "gone")
	wantError(t, "Join of a device that never beat", err, 409, "device_not_alive")
	_, err = loose.Room(ctx, "doc-42", "", 1001, "")
	wantError(t, "Room, a page of 1,001", err, 400, "invalid_query")
	if _, err := b.RoomCounts(ctx, []string{"a,b"}); err == nil || errors.As(err, &e) {
		t.Errorf("RoomCounts of an id with a comma: got %v, want a local error", err)
	}
	if _, err := b.Room(ctx, "", "", 0, ""); err == nil {
		t.Errorf("Room of no room: no error")
	}
	if _, err := b.Settings(ctx, ""); err == nil {
		t.Errorf("Settings of no user: no error")
	}

	// A valid request the node refused for now: 503 with Retry-After.
	pg := testsvc.Postgres(t)
	pgBase := runNode(t, app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PostgresURL: pg.NewDatabase(t)})
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	_, err = newClient(t, c, pgBase, testKey, false).Settings(ctx, "someone")
	e = wantError(t, "Settings with PostgreSQL down", err, 503, "unavailable")
	if !e.Temporary() || e.RetryAfter != time.Second {
		t.Errorf("a 503: got Temporary %v, RetryAfter %v, want true, 1s", e.Temporary(), e.RetryAfter)
	}

	// The transport refuses what the description does not allow, before
	// it reaches the node: the check above is not vacuous.
	_, err = b.SetContacts(ctx, "alice", make([]string, 10001))
	if err == nil || errors.As(err, &e) || !strings.Contains(err.Error(), "openapi.json") {
		t.Errorf("an invalid request through the checking transport: got %v", err)
	}
}

// TestTypesMatchSchemas checks that the JSON fields of the package's
// answer types are exactly the properties of their schemas, required ones
// without omitempty.
func TestTypesMatchSchemas(t *testing.T) {
	c := loadContract(t)
	for _, tc := range []struct {
		typ    reflect.Type
		schema string
	}{
		{reflect.TypeFor[backend.View](), "View"},
		{reflect.TypeFor[backend.SelfView](), "SelfView"},
		{reflect.TypeFor[backend.Settings](), "Settings"},
		{reflect.TypeFor[backend.DebugUser](), "DebugUser"},
		{reflect.TypeFor[backend.DebugDevice](), "DebugDevice"},
		{reflect.TypeFor[backend.DebugRules](), "DebugUser.rules"},
		{reflect.TypeFor[backend.DebugViewer](), "DebugViewer"},
		{reflect.TypeFor[backend.AdminStats](), "AdminStats"},
		{reflect.TypeFor[backend.AdminNode](), "AdminNode"},
		{reflect.TypeFor[backend.Room](), "RoomState"},
		{reflect.TypeFor[backend.RoomPage](), "RoomPage"},
	} {
		name, prop, _ := strings.Cut(tc.schema, ".")
		ref := c.Doc.Components.Schemas[name]
		if ref == nil {
			t.Fatalf("no schema %s", name)
		}
		s := ref.Value
		if prop != "" {
			s = s.Properties[prop].Value
		}
		fields := map[string]bool{} // name → omitempty
		var walk func(reflect.Type)
		walk = func(rt reflect.Type) {
			for i := range rt.NumField() {
				f := rt.Field(i)
				if f.Anonymous {
					walk(f.Type)
					continue
				}
				n, opt, _ := strings.Cut(f.Tag.Get("json"), ",")
				fields[n] = opt == "omitempty"
			}
		}
		walk(tc.typ)
		for n, omit := range fields {
			if s.Properties[n] == nil {
				t.Errorf("%s.%s: schema %s has no property %q", tc.typ.Name(), n, tc.schema, n)
			}
			if omit && slices.Contains(s.Required, n) {
				t.Errorf("%s.%s is omitempty, but schema %s requires it", tc.typ.Name(), n, tc.schema)
			}
		}
		for n := range s.Properties {
			if _, ok := fields[n]; !ok {
				t.Errorf("%s has no field for the property %q of schema %s", tc.typ.Name(), n, tc.schema)
			}
		}
	}
}
