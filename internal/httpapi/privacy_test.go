package httpapi_test

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// truth is what a target really is, and what everyone else should see of it
// when they may see anything.
type truth struct {
	id                string
	selfStatus        string // what the user sees of itself
	pubStatus         string // what others see
	selfLast, pubLast string
	selfDevs, pubDevs int
	text              string // "" reads as null
	version           uint64 // filled from the self view
	contacts          []string
}

// expected is an oracle written from the contract, independent of the
// privacy package: the viewer sees the status (with text, devices and
// version) if it is the user, or the setting is everyone, or it is contacts
// and the viewer is in the target's list; last_seen needs the same rule to
// pass with the last_seen setting and with the status setting (a last_seen
// that moves with every heartbeat would give a hidden status away).
func expected(tr *truth, statusVis, lastSeenVis, viewer string) view {
	self := viewer != "" && viewer == tr.id
	contact := false
	for _, c := range tr.contacts {
		contact = contact || (viewer != "" && viewer == c)
	}
	allows := func(vis string) bool {
		return self || vis == "everyone" || (vis == "contacts" && contact)
	}
	v := view{UserID: tr.id}
	if allows(statusVis) {
		if self {
			v.Status, v.Devices = ptr(tr.selfStatus), ptr(tr.selfDevs)
		} else {
			v.Status, v.Devices = ptr(tr.pubStatus), ptr(tr.pubDevs)
		}
		if tr.text != "" {
			v.StatusText = ptr(tr.text)
		}
		v.Version = ptr(tr.version)
	}
	if allows(lastSeenVis) && allows(statusVis) {
		if self {
			v.LastSeen = ptr(tr.selfLast)
		} else {
			v.LastSeen = ptr(tr.pubLast)
		}
	}
	return v
}

func fmtView(v view) string {
	return "{status:" + show(v.Status) + " last_seen:" + show(v.LastSeen) + " text:" + show(v.StatusText) +
		" devices:" + show(v.Devices) + " version:" + show(v.Version) + "}"
}

// TestPrivacyMatrix asserts, for every pair of settings and every kind of
// viewer, what each of the three read paths lets out, for a user who is
// online and for one who is invisible.
func TestPrivacyMatrix(t *testing.T) {
	e := newEnv(t, opts{})

	// "on" is online with a status text; "inv" went invisible at t0+2.5s,
	// after its beat at t0+2s, and keeps beating. Both list "c" as a
	// contact. "n" lists both of them, which must not make "n" their
	// contact: the target decides.
	e.beat("on", "d", true)
	e.beat("inv", "d", true)
	e.advance(2 * time.Second)
	e.beat("on", "d", true)
	e.beat("inv", "d", true)
	e.setStatus("on", "online", "hi there")
	e.advance(500 * time.Millisecond)
	e.setStatus("inv", "invisible", "")
	e.advance(2500 * time.Millisecond)
	e.beat("on", "d", true)
	e.beat("inv", "d", true)
	for _, id := range []string{"on", "inv"} {
		e.setContacts(id, "c")
	}
	e.setContacts("n", "on", "inv")

	// The public last_seen of inv froze at the moment it went invisible,
	// as a bye at that moment would have left it.
	now, frozen := fmtTime(t0.Add(5*time.Second)), fmtTime(t0.Add(2500*time.Millisecond))
	targets := []*truth{
		{id: "on", selfStatus: "online", pubStatus: "online", selfLast: now, pubLast: now,
			selfDevs: 1, pubDevs: 1, text: "hi there", contacts: []string{"c"}},
		{id: "inv", selfStatus: "invisible", pubStatus: "offline", selfLast: now, pubLast: frozen,
			selfDevs: 1, pubDevs: 0, contacts: []string{"c"}},
	}
	for _, tr := range targets {
		tr.version = *e.getView(tr.id, keyHdr, tr.id).Version
	}
	ids := []string{"on", "inv"}

	// Each viewer reads as a backend naming it (viewer_id) and, except the
	// anonymous one, as a client with its own token.
	type reader struct{ name, viewer, authz, claim string }
	var readers []reader
	for _, v := range []string{"c", "n", "on", "inv"} {
		readers = append(readers,
			reader{"backend as " + v, v, keyHdr, v},
			reader{"client " + v, v, e.token(v, ""), ""},
			reader{"client " + v + " naming itself", v, e.token(v, ""), v})
	}
	readers = append(readers, reader{"anonymous backend read", "", keyHdr, ""})

	vis := []string{"everyone", "contacts", "nobody"}
	for _, sv := range vis {
		for _, lv := range vis {
			for _, id := range ids {
				e.setSettings(id, sv, lv)
			}
			for _, tr := range targets { // a change of settings stamps a version
				tr.version = *e.getView(tr.id, keyHdr, tr.id).Version
			}
			t.Run("status="+sv+",last_seen="+lv, func(t *testing.T) {
				for _, rd := range readers {
					seed := e.seed(ids, rd.authz, rd.claim)
					batch := e.batchViews(ids, rd.authz, rd.claim)
					for _, tr := range targets {
						want := expected(tr, sv, lv, rd.viewer)
						single := e.getView(tr.id, rd.authz, rd.claim)
						for path, got := range map[string]view{"GET /v1/presence": single, "POST /v1/presence/batch": batch[tr.id]} {
							if !sameView(got, want) {
								t.Errorf("%s, target %s, %s: got %s, want %s", rd.name, tr.id, path, fmtView(got), fmtView(want))
							}
						}
						got, ok := seed[tr.id]
						if !ok || !eq(got, want.Status) {
							t.Errorf("%s, target %s, GET /presence/batch: got %s, want %s", rd.name, tr.id, show(got), show(want.Status))
						}
					}
				}
				// The public endpoint is the everyone-view, cacheable.
				for _, tr := range targets {
					r := e.ok("GET", "/v1/public/"+tr.id, "", "")
					var got view
					decodeStrict(t, r.body, &got)
					if want := expected(tr, sv, lv, ""); !sameView(got, want) {
						t.Errorf("GET /v1/public/%s: got %s, want %s", tr.id, fmtView(got), fmtView(want))
					}
					if cc := r.header.Get("Cache-Control"); cc != "public, max-age=30" {
						t.Errorf("public Cache-Control: got %q, want %q", cc, "public, max-age=30")
					}
				}
			})
		}
	}
}

// TestHiddenLooksAbsent checks that a user who hides everything reads, to a
// stranger, byte for byte like every other hidden user whatever they do, and
// that nothing of their state leaks in the raw bytes.
func TestHiddenLooksAbsent(t *testing.T) {
	e := newEnv(t, opts{})
	for _, id := range []string{"a", "b"} {
		e.setSettings(id, "nobody", "nobody")
	}
	e.beat("a", "secret-device", true)
	e.setStatus("a", "busy", "secret text")
	want := func(id string) string {
		return `{"user_id":"` + id + `","status":null,"last_seen":null,"status_text":null,"devices":null,"version":null}` + "\n"
	}
	for _, id := range []string{"a", "b"} {
		for _, authz := range []string{keyHdr, e.token("stranger", "")} {
			r := e.ok("GET", "/v1/presence/"+id, authz, "")
			if string(r.body) != want(id) {
				t.Errorf("%s: got %s, want %s", id, r.body, want(id))
			}
		}
		if r := e.ok("GET", "/v1/public/"+id, "", ""); string(r.body) != want(id) {
			t.Errorf("public %s: got %s", id, r.body)
		}
	}
	r := e.ok("POST", "/v1/presence/batch", keyHdr, `{"user_ids":["a","b"],"viewer_id":"stranger"}`)
	for _, secret := range []string{"secret", "busy", "2026"} {
		if strings.Contains(string(r.body), secret) {
			t.Errorf("batch leaks %q: %s", secret, r.body)
		}
	}
	r = e.ok("GET", "/presence/batch?user_ids=a,b", keyHdr, "")
	if got := string(r.body); got != `{"a":null,"b":null}`+"\n" {
		t.Errorf("seed: got %q", got)
	}

	// A hidden status hides last_seen too, whatever last_seen_visibility
	// says: a last_seen that moves with every heartbeat would tell the
	// status. "a" keeps beating; to a stranger and to a contact it reads
	// like "b", who was never seen.
	e.setContacts("a", "friend")
	e.setContacts("b", "friend")
	for _, st := range []string{"nobody", "contacts"} {
		for _, ls := range []string{"everyone", "contacts", "nobody"} {
			for _, id := range []string{"a", "b"} {
				e.setSettings(id, st, ls)
			}
			e.advance(10 * time.Second)
			e.beat("a", "secret-device", true)
			viewers := []string{"stranger"}
			if st == "nobody" {
				viewers = append(viewers, "friend")
			}
			for _, viewer := range viewers {
				for _, id := range []string{"a", "b"} {
					r := e.ok("GET", "/v1/presence/"+id+"?viewer_id="+viewer, keyHdr, "")
					if string(r.body) != want(id) {
						t.Errorf("status %s, last_seen %s, %s reads %s: got %s, want %s", st, ls, viewer, id, r.body, want(id))
					}
				}
			}
			if r := e.ok("GET", "/v1/public/a", "", ""); string(r.body) != want("a") {
				t.Errorf("status %s, last_seen %s, public a: got %s", st, ls, r.body)
			}
		}
	}
}

// TestClientCannotBorrowAView checks that a client cannot read as someone
// else: a viewer_id other than its own is refused on every read path.
func TestClientCannotBorrowAView(t *testing.T) {
	e := newEnv(t, opts{})
	e.setSettings("t", "contacts", "contacts")
	e.setContacts("t", "friend")
	e.beat("t", "d", true)
	tok := e.token("mallory", "")
	for _, r := range []*resp{
		e.do("GET", "/presence/batch?user_ids=t&viewer_id=friend", tok, ""),
		e.do("GET", "/v1/presence/t?viewer_id=friend", tok, ""),
		e.do("POST", "/v1/presence/batch", tok, `{"user_ids":["t"],"viewer_id":"friend"}`),
		e.do("GET", "/presence/batch?user_ids=t&viewer_id=t", tok, ""),
	} {
		wantError(t, r, http.StatusForbidden, "forbidden")
		if strings.Contains(string(r.body), "online") {
			t.Errorf("a refusal leaks the status: %s", r.body)
		}
	}
	if v := e.getView("t", tok, ""); v.Status != nil {
		t.Errorf("mallory sees %s, want null", show(v.Status))
	}
}

// TestContactChangesApplyAtOnce checks that adding and removing a contact
// changes what that viewer sees on the next read, on every path.
func TestContactChangesApplyAtOnce(t *testing.T) {
	e := newEnv(t, opts{})
	e.setSettings("t", "contacts", "contacts")
	e.beat("t", "d", true)
	read := func() []string {
		t.Helper()
		return []string{
			show(e.seed([]string{"t"}, keyHdr, "x")["t"]),
			show(e.getView("t", keyHdr, "x").Status),
			show(e.batchViews([]string{"t"}, keyHdr, "x")["t"].Status),
			show(e.getView("t", keyHdr, "x").LastSeen),
		}
	}
	hidden := []string{"null", "null", "null", "null"}
	shown := []string{`"online"`, `"online"`, `"online"`, jstr(fmtTime(t0))}
	steps := []struct {
		name, method, path, body string
		want                     []string
	}{
		{"not listed", "", "", "", hidden},
		{"added one", "PUT", "/v1/users/t/contacts/x", "", shown},
		{"removed one", "DELETE", "/v1/users/t/contacts/x", "", hidden},
		{"added in a list", "POST", "/v1/users/t/contacts", `{"contacts":["y","x"]}`, shown},
		{"replaced without x", "PUT", "/v1/users/t/contacts", `{"contacts":["y"]}`, hidden},
		{"replaced with x", "PUT", "/v1/users/t/contacts", `{"contacts":["x"]}`, shown},
		{"settings to nobody", "PUT", "/v1/users/t/settings", `{"status_visibility":"nobody","last_seen_visibility":"nobody"}`, hidden},
		{"settings to contacts", "PUT", "/v1/users/t/settings", `{"status_visibility":"contacts","last_seen_visibility":"contacts"}`, shown},
		{"x lists t: no effect", "PUT", "/v1/users/x/contacts", `{"contacts":["t"]}`, shown},
		{"t drops x", "PUT", "/v1/users/t/contacts", `{"contacts":[]}`, hidden},
	}
	for _, s := range steps {
		if s.method != "" {
			e.ok(s.method, s.path, keyHdr, s.body)
		}
		if got := read(); strings.Join(got, " ") != strings.Join(s.want, " ") {
			t.Errorf("%s: got %v, want %v", s.name, got, s.want)
		}
	}
}
