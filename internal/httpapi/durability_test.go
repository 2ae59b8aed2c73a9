package httpapi_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/clock"
)

// TestDurableAcrossRestart plays a node's life, closes it and opens a new one
// on the same data directory: last_seen, the frozen public last_seen of an
// invisible user, the status text, settings and contacts all come back, and
// an invisible user stays invisible on the first beat after the restart.
func TestDurableAcrossRestart(t *testing.T) {
	e := newEnv(t, opts{})

	// "p" beats twice and stops.
	e.beat("p", "d", true)
	e.advance(3 * time.Second)
	e.beat("p", "d", true)
	pLast := fmtTime(e.clk.Now())

	// "i" beats, goes invisible with a text a second later (its public
	// last_seen freezes at that moment, as a bye would leave it), and keeps
	// beating.
	e.beat("i", "d", true)
	e.advance(time.Second)
	iFrozen := fmtTime(e.clk.Now())
	e.setStatus("i", "invisible", "gone fishing")
	for range 3 {
		e.advance(10 * time.Second)
		e.beat("i", "d", true)
	}
	iLast := fmtTime(e.clk.Now())

	// "s" hides from all but its contacts.
	e.beat("s", "d", true)
	sLast := fmtTime(e.clk.Now())
	e.setSettings("s", "contacts", "contacts")
	e.setContacts("s", "c1", "c2")
	e.ok("POST", "/v1/users/s/contacts", keyHdr, `{"contacts":["c3"]}`)
	e.ok("DELETE", "/v1/users/s/contacts/c2", keyHdr, "")

	// Check the live view once, so the test proves the same after restart.
	check := func(e *env, phase string, selfStatus string) {
		t.Helper()
		if v := e.getView("p", keyHdr, ""); show(v.Status) != `"offline"` || show(v.LastSeen) != jstr(pLast) || show(v.Devices) != "0" {
			t.Errorf("%s: p: got %s, want offline, last_seen %s", phase, fmtView(v), pLast)
		}
		for _, viewer := range []string{"", "c1", "stranger"} {
			v := e.getView("i", keyHdr, viewer)
			if show(v.Status) != `"offline"` || show(v.LastSeen) != jstr(iFrozen) || show(v.StatusText) != `"gone fishing"` || show(v.Devices) != "0" {
				t.Errorf("%s: i seen by %q: got %s, want offline, frozen last_seen %s, text", phase, viewer, fmtView(v), iFrozen)
			}
		}
		if v := e.getView("i", keyHdr, "i"); show(v.Status) != jstr(selfStatus) || show(v.LastSeen) != jstr(iLast) {
			t.Errorf("%s: i seen by itself: got %s, want %s, last_seen %s", phase, fmtView(v), selfStatus, iLast)
		}
		if got := string(e.ok("GET", "/v1/users/s/settings", keyHdr, "").body); got != `{"status_visibility":"contacts","last_seen_visibility":"contacts"}`+"\n" {
			t.Errorf("%s: s settings: got %q", phase, got)
		}
		if got := string(e.ok("GET", "/v1/users/s/contacts", keyHdr, "").body); got != `{"contacts":["c1","c3"]}`+"\n" {
			t.Errorf("%s: s contacts: got %q", phase, got)
		}
		if v := e.getView("s", keyHdr, "c3"); show(v.Status) != `"offline"` || show(v.LastSeen) != jstr(sLast) {
			t.Errorf("%s: s seen by contact c3: got %s, want offline, last_seen %s", phase, fmtView(v), sLast)
		}
		for _, viewer := range []string{"", "c2", "stranger"} {
			if v := e.getView("s", keyHdr, viewer); v.Status != nil || v.LastSeen != nil {
				t.Errorf("%s: s seen by %q: got %s, want all null", phase, viewer, fmtView(v))
			}
		}
		if got := string(e.ok("GET", "/presence/batch?user_ids=p,i,s", keyHdr, "").body); got != `{"p":"offline","i":"offline","s":null}`+"\n" {
			t.Errorf("%s: seed: got %q", phase, got)
		}
	}
	// Let every device die before the restart, as a crash would.
	e.advance(time.Minute)
	check(e, "before restart", "offline")

	e.clk.Advance(time.Hour)
	e = e.restart()
	check(e, "after restart", "offline")

	// The invisible user comes back and stays invisible to others.
	e.beat("i", "d", true)
	if v := e.getView("i", keyHdr, "c1"); show(v.Status) != `"offline"` || show(v.LastSeen) != jstr(iFrozen) || show(v.Devices) != "0" {
		t.Errorf("i after its first beat: got %s, want offline with last_seen %s", fmtView(v), iFrozen)
	}
	if got := string(e.ok("GET", "/presence/batch?user_ids=i", keyHdr, "").body); got != `{"i":"offline"}`+"\n" {
		t.Errorf("seed after the first beat: got %q", got)
	}
	if v := e.getView("i", keyHdr, "i"); show(v.Status) != `"invisible"` || show(v.LastSeen) != jstr(fmtTime(e.clk.Now())) {
		t.Errorf("i to itself after its first beat: got %s, want invisible now", fmtView(v))
	}
	// A plain user comes back online.
	e.beat("p", "d", true)
	if got := string(e.ok("GET", "/presence/batch?user_ids=p", keyHdr, "").body); got != `{"p":"online"}`+"\n" {
		t.Errorf("p after its first beat: got %q", got)
	}
	// And the frozen last_seen survives a second restart too.
	e.advance(time.Minute)
	e = e.restart()
	if v := e.getView("i", keyHdr, ""); show(v.LastSeen) != jstr(iFrozen) {
		t.Errorf("i after a second restart: got %s, want last_seen %s", fmtView(v), iFrozen)
	}
}

// TestEvictedUsersReadFromDisk lets users drop out of memory and checks that
// reads served from the durable store keep last_seen and privacy.
func TestEvictedUsersReadFromDisk(t *testing.T) {
	e := newEnv(t, opts{})
	ctx := context.Background()
	e.setSettings("s", "contacts", "nobody")
	e.setContacts("s", "c")
	e.beat("s", "d", true)
	e.beat("p", "d", true)
	last := fmtTime(e.clk.Now())
	for range 4 { // well past ttl + the memory store's eviction delay
		e.advance(5 * time.Minute)
		if err := e.a.Tracker().Checkpoint(ctx); err != nil {
			t.Fatal(err)
		}
	}
	e.sweep()
	for _, id := range []string{"s", "p"} {
		if r := e.ok("GET", "/v1/debug/users/"+id, keyHdr, ""); !strings.Contains(string(r.body), `"in_memory": false`) {
			t.Fatalf("%s is still in memory: %s", id, r.body)
		}
	}
	if v := e.getView("p", keyHdr, ""); show(v.Status) != `"offline"` || show(v.LastSeen) != jstr(last) {
		t.Errorf("p: got %s, want offline, last_seen %s", fmtView(v), last)
	}
	if v := e.getView("s", keyHdr, "c"); show(v.Status) != `"offline"` || v.LastSeen != nil {
		t.Errorf("s seen by c: got %s, want offline and no last_seen", fmtView(v))
	}
	if v := e.getView("s", keyHdr, "x"); v.Status != nil || v.LastSeen != nil {
		t.Errorf("s seen by x: got %s, want all null", fmtView(v))
	}
	if v := e.getView("s", keyHdr, "s"); show(v.LastSeen) != jstr(last) {
		t.Errorf("s seen by itself: got %s, want last_seen %s", fmtView(v), last)
	}
}

// TestVersionsGrowAcrossRestarts: every start of a node on a data directory
// takes the next epoch from the durable store, so the versions it stamps are
// above every version of an earlier run, even when that run crashed before
// it checkpointed them. Within a run a version counts changes, whatever the
// clock says; all stay below 2^53 for JavaScript clients.
func TestVersionsGrowAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	clk := clock.NewFake(t0)
	var last uint64 // the largest version published so far
	version := func(e *env, phase string) uint64 {
		t.Helper()
		v := e.getView("u", keyHdr, "u")
		if v.Version == nil {
			t.Fatalf("%s: no version: %s", phase, fmtView(v))
		}
		if *v.Version >= 1<<53 {
			t.Errorf("%s: version %d is not below 2^53", phase, *v.Version)
		}
		return *v.Version
	}
	// play makes three changes and checks that each is one above the last.
	play := func(e *env, phase string) {
		t.Helper()
		e.beat("u", "d", true)
		first := version(e, phase+": online")
		if first <= last {
			t.Errorf("%s: first version %d, want above %d from the run before", phase, first, last)
		}
		e.advance(20 * time.Second) // time passes; versions do not care
		e.beat("u", "d", true)
		e.setStatus("u", "busy", "")
		e.setStatus("u", "busy", "x")
		if v := version(e, phase+": busy"); v != first+2 {
			t.Errorf("%s: after two more changes version %d, want %d", phase, v, first+2)
		}
		last = first + 2
	}

	// Run 1 ends in a crash: no Close, no checkpoint, and the next run
	// opens the same data directory while this one still holds it.
	e1 := newEnv(t, opts{dir: dir, clk: clk})
	play(e1, "run 1")
	if n := e1.a.Tracker().Stats().Flushed; n != 0 {
		t.Fatalf("run 1 checkpointed %d users; the test needs it not to", n)
	}
	e2 := newEnv(t, opts{dir: dir, clk: clk})
	if v := e2.getView("u", keyHdr, "u"); v.Version != nil && *v.Version >= last {
		t.Fatalf("run 2 before any change: version %d; the crash should have lost run 1's %d", *v.Version, last)
	}
	e2.advance(time.Minute) // u's device from run 1 is gone with run 1's memory
	play(e2, "run 2 after a crash")

	// Run 3 after a clean stop, and run 4 after another one.
	e2.close()
	e3 := newEnv(t, opts{dir: dir, clk: clk})
	e3.advance(time.Minute)
	play(e3, "run 3 after a clean stop")
	e4 := e3.restart()
	e4.advance(time.Minute)
	play(e4, "run 4")
	e1.close()
}
