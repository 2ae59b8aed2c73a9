// Package durabletest is the conformance suite of presenced's durable
// stores. Every backend (SQLite, PostgreSQL) runs the same Run from its own
// tests, so they all keep the same promises: profiles round-trip exactly,
// last_seen checkpoints never move backwards, batches of any size work in
// one call, contact lists behave as sets, and concurrent writers never fail
// (contact-list writes may be refused with writegate.ErrBusy while too
// many of them wait: the suite retries those).
//
// Backend-specific promises (durability across a reopen, schema
// migrations) are tested next to the backend.
package durabletest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/writegate"
)

// Store is everything a durable backend provides. Implementations are safe
// for concurrent use.
type Store interface {
	tracker.Durable
	// SetContacts replaces user's contact list (the users user lets see
	// them when a visibility is Contacts) atomically. The contact-list
	// writes (SetContacts, AddContacts, RemoveContacts) wait in a bounded
	// queue behind the writes of statuses, settings and checkpoints; one
	// that finds the queue full fails at once with writegate.ErrBusy,
	// having changed nothing.
	SetContacts(ctx context.Context, user string, contacts []string) error
	// AddContacts adds to user's contact list; listed contacts are ignored.
	AddContacts(ctx context.Context, user string, contacts []string) error
	// RemoveContacts removes from user's contact list; unlisted ones are ignored.
	RemoveContacts(ctx context.Context, user string, contacts []string) error
	// Contacts returns user's contact list in ascending byte order, empty
	// (not nil, not an error) for a user without one.
	Contacts(ctx context.Context, user string) ([]string, error)
	// ListedBy calls fn for each of owners whose contact list holds viewer.
	ListedBy(ctx context.Context, viewer string, owners []string, fn func(owner string)) error
	// NextEpoch durably counts one more run of the node and returns it.
	NextEpoch(ctx context.Context) (uint64, error)
	// Ping reports whether the store is reachable.
	Ping(ctx context.Context) error
	// Close releases the store; it is idempotent.
	Close() error
}

// Run runs the suite. open must return a fresh, empty store each time it is
// called; the suite closes every store it opens when the subtest ends, and
// open may arrange the same with t.Cleanup (Close is idempotent).
func Run(t *testing.T, open func(t *testing.T) Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s Store)
	}{
		{"ProfileRoundTrip", testProfileRoundTrip},
		{"UnknownIDsSkipped", testUnknownIDsSkipped},
		{"LoadManyIDs", testLoadManyIDs},
		{"LastSeenNeverBackwards", testLastSeenNeverBackwards},
		{"PublicFace", testPublicFace},
		{"StatusKeepsTheFace", testStatusKeepsTheFace},
		{"ShuffledBatch", testShuffledBatch},
		{"WritesTouchOnlyTheirColumns", testWritesTouchOnlyTheirColumns},
		{"BigBatch", testBigBatch},
		{"CancelledBatchWritesNothing", testCancelledBatchWritesNothing},
		{"ConcurrentWriters", testConcurrentWriters},
		{"ConcurrentStatusOrder", testConcurrentStatusOrder},
		{"CancelledStatusWrites", testCancelledStatusWrites},
		{"Contacts", testContacts},
		{"ContactsPerUser", testContactsPerUser},
		{"ListedBy", testListedBy},
		{"ListedByManyOwners", testListedByManyOwners},
		{"ContactLimit", testContactLimit},
		{"EpochGrows", testEpochGrows},
		{"PingAndClose", testPingAndClose},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t)
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			tc.fn(t, s)
		})
	}
}

// ids that a backend must store as given: numeric, UUID, Unicode, SQL
// metacharacters, the longest allowed.
var odd = []string{
	"1",
	"9223372036854775807",
	"123e4567-e89b-12d3-a456-426614174000",
	"ünïcødé-用户",
	"o'brien\";--)",
	"%_*?\\",
	strings.Repeat("x", presence.MaxIDLen),
}

func testProfileRoundTrip(t *testing.T, s Store) {
	tests := []struct {
		name string
		p    presence.Profile
	}{
		{"zero", presence.Profile{UserID: "zero"}},
		{"online plain", presence.Profile{UserID: "42", LastSeen: 1_700_000_000_000, PubLastSeen: 1_700_000_000_000, Version: 1_700_000_000_000_000}},
		{"busy with text", presence.Profile{UserID: "busy", Manual: presence.ManualBusy, Text: "in a meeting", LastSeen: 5, PubLastSeen: 5, Version: 7}},
		{"away unicode", presence.Profile{UserID: "away", Manual: presence.ManualAway, Text: "🌴 en vacances — 休假中 ", LastSeen: 10, PubLastSeen: 9, Version: 11}},
		{"invisible frozen", presence.Profile{
			UserID: "inv", Manual: presence.ManualInvisible, Text: "", LastSeen: 2_000_000_000_000, PubLastSeen: 1_000_000_000_000,
			Version: 1 << 62, Settings: presence.Settings{Status: presence.Nobody, LastSeen: presence.Contacts},
		}},
		{"invisible, text changed since", presence.Profile{
			UserID: "face", Manual: presence.ManualInvisible, Text: "gone fishing", LastSeen: 30, PubLastSeen: 20,
			Version: 12, PubText: "lunch", PubVersion: 10,
		}},
		{"contacts only", presence.Profile{UserID: "c", Settings: presence.Settings{Status: presence.Contacts, LastSeen: presence.Nobody}}},
		{"longest text", presence.Profile{UserID: "long", Text: strings.Repeat("é", presence.MaxTextLen), LastSeen: 1}},
	}
	for i, id := range odd {
		tests = append(tests, struct {
			name string
			p    presence.Profile
		}{fmt.Sprintf("odd id %d", i), presence.Profile{UserID: id, Text: id, LastSeen: int64(i + 1), PubLastSeen: int64(i), Version: uint64(i + 2)}})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.p
			save(t, s, &p)
			got := load(t, s, p.UserID)
			if g, ok := got[p.UserID]; !ok || g != stored(p) {
				t.Errorf("LoadProfiles(%q)\n got %+v (found %v)\nwant %+v", p.UserID, g, ok, stored(p))
			}
		})
	}
}

func testUnknownIDsSkipped(t *testing.T, s Store) {
	ctx := t.Context()
	for _, id := range []string{"a", "c"} {
		if err := s.SaveStatus(ctx, id, presence.ManualBusy, id); err != nil {
			t.Fatalf("SaveStatus(%q): %v", id, err)
		}
	}
	tests := []struct {
		name string
		ids  []string
		want []string
	}{
		{"nil", nil, nil},
		{"empty", []string{}, nil},
		{"all unknown", []string{"b", "d", "A", "a "}, nil},
		{"mixed", []string{"b", "a", "x", "c", "y"}, []string{"a", "c"}},
		{"prefix is not a match", []string{"", "a%", "_"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := slices.Sorted(maps.Keys(load(t, s, tc.ids...)))
			if !slices.Equal(got, tc.want) {
				t.Errorf("LoadProfiles(%q) found %q, want %q", tc.ids, got, tc.want)
			}
		})
	}
}

// testLoadManyIDs loads more ids in one call than SQLite takes variables in
// one statement.
func testLoadManyIDs(t *testing.T, s Store) {
	ctx := t.Context()
	const n = 2500
	batch := make([]presence.Profile, n)
	for i := range batch {
		batch[i] = presence.Profile{UserID: fmt.Sprintf("u%05d", i), LastSeen: int64(1000 + i), PubLastSeen: int64(i), Version: uint64(7 * i)}
	}
	if err := s.SaveLastSeen(ctx, batch); err != nil {
		t.Fatalf("SaveLastSeen(%d profiles): %v", n, err)
	}
	// Every known id, interleaved with as many unknown ones, in one call.
	ids := make([]string, 0, 2*n)
	for i := range batch {
		ids = append(ids, batch[i].UserID, fmt.Sprintf("unknown%05d", i))
	}
	got := load(t, s, ids...)
	if len(got) != n {
		t.Errorf("LoadProfiles(%d ids) found %d profiles, want %d", len(ids), len(got), n)
	}
	for _, want := range batch {
		if g := got[want.UserID]; g != want {
			t.Errorf("LoadProfiles: %q\n got %+v\nwant %+v", want.UserID, g, want)
		}
	}
}

func testLastSeenNeverBackwards(t *testing.T, s Store) {
	ctx := t.Context()
	type ls struct {
		LastSeen, PubLastSeen int64
		Version               uint64
	}
	tests := []struct {
		name  string
		saves [][]ls // batches, each naming the user once or more
		want  ls
	}{
		{"first write", [][]ls{{{10, 9, 100}}}, ls{10, 9, 100}},
		{"forwards", [][]ls{{{10, 9, 100}}, {{20, 20, 200}}}, ls{20, 20, 200}},
		{"stale batch", [][]ls{{{20, 20, 200}}, {{10, 9, 100}}}, ls{20, 20, 200}},
		{"replay", [][]ls{{{20, 20, 200}}, {{20, 20, 200}}, {{20, 20, 200}}}, ls{20, 20, 200}},
		{"each column on its own", [][]ls{{{20, 5, 100}}, {{10, 15, 300}}}, ls{20, 15, 300}},
		{"zeros change nothing", [][]ls{{{20, 15, 300}}, {{0, 0, 0}}}, ls{20, 15, 300}},
		{"user twice in a batch, newest first", [][]ls{{{30, 30, 300}, {10, 10, 100}}}, ls{30, 30, 300}},
		{"user twice in a batch, newest last", [][]ls{{{10, 10, 100}, {30, 30, 300}}}, ls{30, 30, 300}},
		{"out of order batches", [][]ls{{{30, 25, 300}}, {{10, 10, 100}}, {{20, 20, 200}}, {{40, 25, 400}}}, ls{40, 25, 400}},
		{"large version", [][]ls{{{1, 1, 1 << 62}}, {{2, 2, 1<<62 - 1}}}, ls{2, 2, 1 << 62}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			user := fmt.Sprintf("user%d", i)
			for _, saves := range tc.saves {
				batch := make([]presence.Profile, len(saves))
				for j, v := range saves {
					batch[j] = presence.Profile{UserID: user, LastSeen: v.LastSeen, PubLastSeen: v.PubLastSeen, Version: v.Version}
				}
				if err := s.SaveLastSeen(ctx, batch); err != nil {
					t.Fatalf("SaveLastSeen(%+v): %v", batch, err)
				}
			}
			p, ok := load(t, s, user)[user]
			if got := (ls{p.LastSeen, p.PubLastSeen, p.Version}); !ok || got != tc.want {
				t.Errorf("after %v: got %+v (found %v), want %+v", tc.saves, got, ok, tc.want)
			}
		})
	}
}

// testPublicFace: the public face of an invisible user whose text changed
// since they vanished (PubText, PubVersion) goes with the newest version
// checkpointed — an older checkpoint leaves it, a newer one replaces it,
// one whose face is its own text and version clears it — and a profile
// whose face is its own reads back without one.
func testPublicFace(t *testing.T, s Store) {
	ctx := t.Context()
	type cp struct {
		text, pubText string
		version, pub  uint64
	}
	tests := []struct {
		name  string
		saves [][]cp
		want  cp // as loaded: pub 0 without a face
	}{
		{"frozen", [][]cp{{{"x", "lunch", 12, 10}}}, cp{"", "lunch", 12, 10}},
		{"its own face is none", [][]cp{{{"x", "x", 12, 12}}}, cp{"", "", 12, 0}},
		{"an older checkpoint leaves it", [][]cp{{{"x", "lunch", 12, 10}}, {{"y", "brb", 11, 9}}}, cp{"", "lunch", 12, 10}},
		{"a newer one replaces it", [][]cp{{{"x", "lunch", 12, 10}}, {{"y", "lunch", 13, 10}}}, cp{"", "lunch", 13, 10}},
		{"visible again clears it", [][]cp{{{"x", "lunch", 12, 10}}, {{"x", "x", 14, 14}}}, cp{"", "", 14, 0}},
		{"twice in a batch, newest last", [][]cp{{{"x", "lunch", 12, 10}, {"y", "nap", 15, 14}}}, cp{"", "nap", 15, 14}},
		{"twice in a batch, newest first", [][]cp{{{"y", "nap", 15, 14}, {"x", "lunch", 12, 10}}}, cp{"", "nap", 15, 14}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			user := fmt.Sprintf("face%d", i)
			for _, saves := range tc.saves {
				batch := make([]presence.Profile, len(saves))
				for j, c := range saves {
					batch[j] = presence.Profile{UserID: user, Text: c.text, LastSeen: 1, Version: c.version, PubText: c.pubText, PubVersion: c.pub}
				}
				if err := s.SaveLastSeen(ctx, batch); err != nil {
					t.Fatalf("SaveLastSeen(%+v): %v", batch, err)
				}
			}
			p := load(t, s, user)[user]
			if got := (cp{"", p.PubText, p.Version, p.PubVersion}); got != tc.want {
				t.Errorf("after %+v: got %+v, want %+v", tc.saves, got, tc.want)
			}
		})
	}
}

// testStatusKeepsTheFace: a status written keeps the public face in the
// same write (Profile.SaveStatus), so that a record read before the next
// checkpoint — or with none to come — never shows anyone a text the user
// set while invisible: invisible keeps the face the record shows (at
// version 1 at least, for a user never checkpointed), any other status
// makes the text the face; and a checkpoint taken before the status was
// written does not undo it (Profile.Checkpoint), while one taken after
// brings the face up to date.
func testStatusKeepsTheFace(t *testing.T, s Store) {
	ctx := t.Context()
	type face struct {
		text    string
		version uint64
	}
	st := func(m presence.Manual, text string) faceStep { return faceStep{m: m, text: text} }
	cp := func(m presence.Manual, text string, version uint64, pubText string, pubVersion uint64) faceStep {
		return faceStep{cp: &presence.Profile{Manual: m, Text: text, LastSeen: int64(version), PubLastSeen: int64(version),
			Version: version, PubText: pubText, PubVersion: pubVersion}}
	}
	inv, none := presence.ManualInvisible, presence.ManualNone
	tests := []struct {
		name  string
		steps []faceStep
		want  face // Public() of the record read back
		text  string
	}{
		{"invisible from nothing", []faceStep{st(inv, "at the doctor")}, face{"", 1}, "at the doctor"},
		{"provisioned invisible, then a text", []faceStep{st(inv, ""), st(inv, "at the doctor")}, face{"", 1}, "at the doctor"},
		{"invisible before any checkpoint", []faceStep{st(none, "lunch"), st(inv, "at the clinic")}, face{"lunch", 1}, "at the clinic"},
		{"invisible after a checkpoint", []faceStep{st(none, "lunch"), cp(none, "lunch", 12, "lunch", 12), st(inv, "at the clinic")},
			face{"lunch", 12}, "at the clinic"},
		{"a face kept stays", []faceStep{cp(inv, "nap", 12, "lunch", 10), st(inv, "at the clinic")}, face{"lunch", 10}, "at the clinic"},
		{"visible again", []faceStep{cp(inv, "nap", 12, "lunch", 10), st(inv, "at the clinic"), st(presence.ManualBusy, "back")},
			face{"back", 12}, "back"},
		{"a checkpoint taken before the status", []faceStep{st(none, "lunch"), st(inv, "secret"), cp(none, "lunch", 12, "lunch", 12)},
			face{"lunch", 1}, "secret"},
		{"a checkpoint taken after the status", []faceStep{st(none, ""), st(inv, "lunch"), cp(inv, "lunch", 12, "lunch", 12)},
			face{"lunch", 12}, "lunch"},
		{"a text changed since that checkpoint", []faceStep{st(none, ""), st(inv, "lunch"), cp(inv, "lunch", 12, "lunch", 12), st(inv, "secret")},
			face{"lunch", 12}, "secret"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			user := fmt.Sprintf("sf%d", i)
			for _, st := range tc.steps {
				if st.cp != nil {
					p := *st.cp
					p.UserID = user
					if err := s.SaveLastSeen(ctx, []presence.Profile{p}); err != nil {
						t.Fatalf("SaveLastSeen(%+v): %v", p, err)
					}
					continue
				}
				if err := s.SaveStatus(ctx, user, st.m, st.text); err != nil {
					t.Fatalf("SaveStatus(%v, %q): %v", st.m, st.text, err)
				}
			}
			p, ok := load(t, s, user)[user]
			text, v := p.Public()
			if got := (face{text, v}); !ok || got != tc.want || p.Text != tc.text || v > p.Version {
				t.Errorf("after %v: public %+v, own %q at %d (found %v); want public %+v, own %q, the public version not above the version",
					tc.steps, got, p.Text, p.Version, ok, tc.want, tc.text)
			}
			// The rule the stores follow, and the tracker's tests'
			// durable stand-in applies.
			var q presence.Profile
			for _, st := range tc.steps {
				if st.cp != nil {
					q.Checkpoint(st.cp)
				} else {
					q.SaveStatus(st.m, st.text)
				}
			}
			if text, v := q.Public(); (face{text, v}) != tc.want || q.Text != tc.text {
				t.Errorf("presence.Profile after %v: public %q at %d, own %q; want %+v, %q", tc.steps, text, v, q.Text, tc.want, tc.text)
			}
		})
	}
}

// faceStep is a step of testStatusKeepsTheFace: a status (m, text) or,
// with cp set, a checkpoint.
type faceStep struct {
	m    presence.Manual
	text string
	cp   *presence.Profile
}

func (s faceStep) String() string {
	if s.cp != nil {
		return fmt.Sprintf("checkpoint(%v %q v%d, face %q v%d)", s.cp.Manual, s.cp.Text, s.cp.Version, s.cp.PubText, s.cp.PubVersion)
	}
	return fmt.Sprintf("status(%v %q)", s.m, s.text)
}

// testShuffledBatch writes a batch naming each of a few users many times,
// in an order where newer and older checkpoints alternate; the newest must
// win whatever way the backend splits the batch into statements.
func testShuffledBatch(t *testing.T, s Store) {
	const users, each = 10, 300
	batch := make([]presence.Profile, 0, users*each)
	for k := range each {
		// k-th checkpoint of each user, taken in a scrambled order of k.
		j := int64((k * 7919) % each)
		for u := range users {
			batch = append(batch, presence.Profile{UserID: fmt.Sprintf("u%d", u), LastSeen: 1000 + j, PubLastSeen: 500 + j, Version: uint64(10000 + j)})
		}
	}
	if err := s.SaveLastSeen(t.Context(), batch); err != nil {
		t.Fatalf("SaveLastSeen(%d profiles): %v", len(batch), err)
	}
	ids := make([]string, users)
	for u := range ids {
		ids[u] = fmt.Sprintf("u%d", u)
	}
	got := load(t, s, ids...)
	for _, id := range ids {
		want := presence.Profile{UserID: id, LastSeen: 1000 + each - 1, PubLastSeen: 500 + each - 1, Version: 10000 + each - 1}
		if g := got[id]; g != want {
			t.Errorf("%s\n got %+v\nwant %+v", id, g, want)
		}
	}
}

func testWritesTouchOnlyTheirColumns(t *testing.T, s Store) {
	ctx := t.Context()
	full := presence.Profile{
		Manual: presence.ManualInvisible, Text: "gone fishing", LastSeen: 50, PubLastSeen: 40, Version: 500,
		Settings: presence.Settings{Status: presence.Contacts, LastSeen: presence.Nobody},
	}
	tests := []struct {
		name  string
		write func(ctx context.Context, user string) error
		want  func(p presence.Profile) presence.Profile // from full
	}{
		{"SaveLastSeen leaves status, text and settings", func(ctx context.Context, user string) error {
			return s.SaveLastSeen(ctx, []presence.Profile{{UserID: user, Manual: presence.ManualBusy, Text: "ignored", LastSeen: 60, PubLastSeen: 60, Version: 600,
				Settings: presence.Settings{Status: presence.Everyone, LastSeen: presence.Everyone}}})
		}, func(p presence.Profile) presence.Profile {
			p.LastSeen, p.PubLastSeen, p.Version = 60, 60, 600
			return p
		}},
		{"SaveStatus leaves last_seen, version and settings", func(ctx context.Context, user string) error {
			return s.SaveStatus(ctx, user, presence.ManualNone, "")
		}, func(p presence.Profile) presence.Profile {
			p.Manual, p.Text = presence.ManualNone, ""
			p.PubText, p.PubVersion = "", 0 // the text is the face now: Profile.SaveStatus
			return p
		}},
		{"SaveSettings leaves last_seen, version, status and text", func(ctx context.Context, user string) error {
			return s.SaveSettings(ctx, user, presence.Settings{Status: presence.Nobody, LastSeen: presence.Everyone})
		}, func(p presence.Profile) presence.Profile {
			p.Settings = presence.Settings{Status: presence.Nobody, LastSeen: presence.Everyone}
			return p
		}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := full
			p.UserID = fmt.Sprintf("user%d", i)
			save(t, s, &p)
			if err := tc.write(ctx, p.UserID); err != nil {
				t.Fatalf("write: %v", err)
			}
			want := tc.want(stored(p)) // the invisible user's face kept
			if got := load(t, s, p.UserID)[p.UserID]; got != want {
				t.Errorf("after write\n got %+v\nwant %+v", got, want)
			}
		})
	}

	// A record created by one write gets the defaults for the rest.
	created := []struct {
		name  string
		write func(ctx context.Context, user string) error
		want  presence.Profile // UserID filled in below
	}{
		{"SaveLastSeen creates", func(ctx context.Context, user string) error {
			return s.SaveLastSeen(ctx, []presence.Profile{{UserID: user, Manual: presence.ManualBusy, Text: "ignored", LastSeen: 3, PubLastSeen: 2, Version: 1,
				Settings: presence.Settings{Status: presence.Nobody, LastSeen: presence.Nobody}}})
		}, presence.Profile{LastSeen: 3, PubLastSeen: 2, Version: 1}},
		{"SaveStatus creates", func(ctx context.Context, user string) error {
			return s.SaveStatus(ctx, user, presence.ManualAway, "brb")
		}, presence.Profile{Manual: presence.ManualAway, Text: "brb"}},
		{"SaveSettings creates", func(ctx context.Context, user string) error {
			return s.SaveSettings(ctx, user, presence.Settings{Status: presence.Contacts, LastSeen: presence.Contacts})
		}, presence.Profile{Settings: presence.Settings{Status: presence.Contacts, LastSeen: presence.Contacts}}},
	}
	for i, tc := range created {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			want.UserID = fmt.Sprintf("new%d", i)
			if err := tc.write(ctx, want.UserID); err != nil {
				t.Fatalf("write: %v", err)
			}
			if got, ok := load(t, s, want.UserID)[want.UserID]; !ok || got != want {
				t.Errorf("after write\n got %+v (found %v)\nwant %+v", got, ok, want)
			}
		})
	}
}

// testBigBatch writes a checkpoint of 10,000 users in one call, twice (the
// second time as updates).
func testBigBatch(t *testing.T, s Store) {
	ctx := t.Context()
	const n = 10000
	batch := make([]presence.Profile, n)
	ids := make([]string, n)
	for round := int64(1); round <= 2; round++ {
		for i := range batch {
			ids[i] = fmt.Sprintf("big%05d", i)
			batch[i] = presence.Profile{UserID: ids[i], LastSeen: round*1e12 + int64(i), PubLastSeen: round * 1e12, Version: uint64(round*1e15) + uint64(i)}
		}
		if err := s.SaveLastSeen(ctx, batch); err != nil {
			t.Fatalf("round %d: SaveLastSeen(%d profiles): %v", round, n, err)
		}
		got := load(t, s, ids...)
		if len(got) != n {
			t.Fatalf("round %d: LoadProfiles found %d profiles, want %d", round, len(got), n)
		}
		bad := 0
		for _, want := range batch {
			if g := got[want.UserID]; g != want && bad < 5 {
				bad++
				t.Errorf("round %d: %q\n got %+v\nwant %+v", round, want.UserID, g, want)
			}
		}
	}
}

func testCancelledBatchWritesNothing(t *testing.T, s Store) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	batch := []presence.Profile{{UserID: "a", LastSeen: 1}, {UserID: "b", LastSeen: 2}}
	if err := s.SaveLastSeen(ctx, batch); err == nil {
		t.Errorf("SaveLastSeen with a cancelled context: got nil error, want one")
	}
	if got := load(t, s, "a", "b"); len(got) != 0 {
		t.Errorf("after a failed SaveLastSeen, found %v, want nothing", got)
	}
}

// testConcurrentWriters runs writers of every kind at once, with readers
// alongside; none may fail (no "database is locked") and the end state must
// hold every write.
func testConcurrentWriters(t *testing.T, s Store) {
	ctx := t.Context()
	const (
		writers = 8
		rounds  = 20
	)
	var wg sync.WaitGroup
	errs := make(chan error, 4*writers)
	for g := range writers {
		wg.Go(func() {
			own := fmt.Sprintf("w%d", g)
			for i := range rounds {
				ls := int64(g*rounds + i + 1)
				batch := []presence.Profile{
					{UserID: "shared", LastSeen: ls, PubLastSeen: ls, Version: uint64(ls)},
					{UserID: own, LastSeen: int64(i + 1), PubLastSeen: int64(i + 1), Version: uint64(i + 1)},
				}
				if err := s.SaveLastSeen(ctx, batch); err != nil {
					errs <- fmt.Errorf("writer %d: SaveLastSeen: %w", g, err)
					return
				}
				if err := s.SaveStatus(ctx, own, presence.ManualBusy, fmt.Sprintf("round %d", i)); err != nil {
					errs <- fmt.Errorf("writer %d: SaveStatus: %w", g, err)
					return
				}
				if err := s.SaveSettings(ctx, own, presence.Settings{Status: presence.Visibility(i % 3), LastSeen: presence.Visibility(i % 3)}); err != nil {
					errs <- fmt.Errorf("writer %d: SaveSettings: %w", g, err)
					return
				}
				if err := unbusy(func() error { return s.AddContacts(ctx, "owner", []string{fmt.Sprintf("c%d-%02d", g, i)}) }); err != nil {
					errs <- fmt.Errorf("writer %d: AddContacts: %w", g, err)
					return
				}
			}
		})
	}
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for r := range 2 {
		readers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := s.LoadProfiles(ctx, []string{"shared", "w0", "w1"}, func(*presence.Profile) {}); err != nil {
					errs <- fmt.Errorf("reader %d: LoadProfiles: %w", r, err)
					return
				}
				if _, err := s.Contacts(ctx, "owner"); err != nil {
					errs <- fmt.Errorf("reader %d: Contacts: %w", r, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}

	ids := []string{"shared"}
	for g := range writers {
		ids = append(ids, fmt.Sprintf("w%d", g))
	}
	got := load(t, s, ids...)
	const top = writers * rounds
	if p := got["shared"]; p.LastSeen != top || p.PubLastSeen != top || p.Version != top {
		t.Errorf("shared: got last_seen %d, pub %d, version %d; want %d for all", p.LastSeen, p.PubLastSeen, p.Version, top)
	}
	last := rounds - 1
	for _, id := range ids[1:] {
		want := presence.Profile{
			UserID: id, Manual: presence.ManualBusy, Text: fmt.Sprintf("round %d", last),
			LastSeen: rounds, PubLastSeen: rounds, Version: rounds,
			Settings: presence.Settings{Status: presence.Visibility(last % 3), LastSeen: presence.Visibility(last % 3)},
		}
		if g := got[id]; g != want {
			t.Errorf("%s\n got %+v\nwant %+v", id, g, want)
		}
	}
	var want []string
	for g := range writers {
		for i := range rounds {
			want = append(want, fmt.Sprintf("c%d-%02d", g, i))
		}
	}
	slices.Sort(want)
	if got := contacts(t, s, "owner"); !slices.Equal(got, want) {
		t.Errorf("Contacts(owner) = %d entries %q…, want %d entries %q…", len(got), head(got), len(want), head(want))
	}
}

// testConcurrentStatusOrder: writers of status and settings, each for its
// own users, at once (so that a backend which groups concurrent writes
// groups them). Each writer's writes of one user land in the order it made
// them, each is visible to a read once the call returned, and a status
// write and a settings write of one user never undo each other.
func testConcurrentStatusOrder(t *testing.T, s Store) {
	ctx := t.Context()
	const (
		writers = 16
		rounds  = 25
	)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for g := range writers {
		wg.Go(func() {
			user := fmt.Sprintf("w%d", g)
			other := fmt.Sprintf("w%d-settings", g) // written only with settings
			for i := range rounds {
				text := fmt.Sprintf("%d/%d", g, i)
				m := []presence.Manual{presence.ManualBusy, presence.ManualAway, presence.ManualInvisible}[i%3]
				if err := s.SaveStatus(ctx, user, m, text); err != nil {
					errs <- fmt.Errorf("writer %d: SaveStatus #%d: %w", g, i, err)
					return
				}
				st := presence.Settings{Status: presence.Visibility(i % 3), LastSeen: presence.Visibility((i + 1) % 3)}
				if err := s.SaveSettings(ctx, user, st); err != nil {
					errs <- fmt.Errorf("writer %d: SaveSettings #%d: %w", g, i, err)
					return
				}
				if err := s.SaveSettings(ctx, other, st); err != nil {
					errs <- fmt.Errorf("writer %d: SaveSettings(other) #%d: %w", g, i, err)
					return
				}
				var got presence.Profile
				if err := s.LoadProfiles(ctx, []string{user}, func(p *presence.Profile) { got = *p }); err != nil {
					errs <- fmt.Errorf("writer %d: LoadProfiles: %w", g, err)
					return
				}
				if got.Manual != m || got.Text != text || got.Settings != st {
					errs <- fmt.Errorf("writer %d: read after write #%d: got %v %q %+v, want %v %q %+v", g, i, got.Manual, got.Text, got.Settings, m, text, st)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	last := rounds - 1
	wantSettings := presence.Settings{Status: presence.Visibility(last % 3), LastSeen: presence.Visibility((last + 1) % 3)}
	var ids []string
	for g := range writers {
		ids = append(ids, fmt.Sprintf("w%d", g), fmt.Sprintf("w%d-settings", g))
	}
	got := load(t, s, ids...)
	for g := range writers {
		user := fmt.Sprintf("w%d", g)
		// A status invisible among the writes gave the record a face at
		// version 1 (Profile.SaveStatus); the last, busy, made its text
		// the face.
		want := presence.Profile{UserID: user, Manual: presence.ManualBusy, Text: fmt.Sprintf("%d/%d", g, last), Version: 1, Settings: wantSettings}
		if g := got[user]; g != want {
			t.Errorf("%s\n got %+v\nwant %+v", user, g, want)
		}
		other := user + "-settings"
		if g := got[other]; g != (presence.Profile{UserID: other, Settings: wantSettings}) {
			t.Errorf("%s: got %+v, want only settings %+v", other, g, wantSettings)
		}
	}
}

// testCancelledStatusWrites: a status or settings write whose context is
// already done fails with the context's error and writes nothing, also
// among concurrent writes that succeed; a write whose context ends while
// it runs either fails with that error or is durable when it returns nil;
// and the store goes on writing afterwards.
func testCancelledStatusWrites(t *testing.T, s Store) {
	ctx := t.Context()
	done, cancel := context.WithCancel(ctx)
	cancel()
	const writers = 32
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for g := range writers {
		wg.Go(func() {
			c := ctx
			if g%2 == 1 {
				c = done
			}
			user := fmt.Sprintf("c%02d", g)
			if g%4 < 2 {
				errs[g] = s.SaveStatus(c, user, presence.ManualBusy, user)
			} else {
				errs[g] = s.SaveSettings(c, user, presence.Settings{Status: presence.Nobody})
			}
		})
	}
	wg.Wait()
	var ids []string
	for g := range writers {
		ids = append(ids, fmt.Sprintf("c%02d", g))
	}
	got := load(t, s, ids...)
	for g, err := range errs {
		user := fmt.Sprintf("c%02d", g)
		_, found := got[user]
		switch {
		case g%2 == 1 && !errors.Is(err, context.Canceled):
			t.Errorf("%s, context cancelled before: got error %v, want one wrapping %v", user, err, context.Canceled)
		case g%2 == 1 && found:
			t.Errorf("%s, context cancelled before: written", user)
		case g%2 == 0 && err != nil:
			t.Errorf("%s: %v", user, err)
		case g%2 == 0 && !found:
			t.Errorf("%s: returned nil but not written", user)
		}
	}

	// Contexts that end at any moment of the writes.
	const n = 64
	results := make([]error, n)
	for i := range n {
		wg.Go(func() {
			c, cancel := context.WithCancel(ctx)
			go func() {
				for range i % 8 {
					runtime.Gosched()
				}
				cancel()
			}()
			results[i] = s.SaveStatus(c, fmt.Sprintf("r%02d", i), presence.ManualAway, "r")
			cancel()
		})
	}
	wg.Wait()
	ids = ids[:0]
	for i := range n {
		ids = append(ids, fmt.Sprintf("r%02d", i))
	}
	got = load(t, s, ids...)
	for i, err := range results {
		user := fmt.Sprintf("r%02d", i)
		if err == nil {
			if p, ok := got[user]; !ok || p.Manual != presence.ManualAway {
				t.Errorf("%s: SaveStatus returned nil, but the record is %+v (found %v)", user, p, ok)
			}
		} else if !errors.Is(err, context.Canceled) {
			t.Errorf("%s: got error %v, want nil or one wrapping %v", user, err, context.Canceled)
		}
	}
	if err := s.SaveStatus(ctx, "after", presence.ManualBusy, "still writing"); err != nil {
		t.Fatalf("SaveStatus after cancelled writes: %v", err)
	}
	if p := load(t, s, "after")["after"]; p.Text != "still writing" {
		t.Errorf("after cancelled writes: got %+v", p)
	}
}

// Poison is the status text that RunPoisoned's store refuses to write.
const Poison = "poison"

// RunPoisoned checks that concurrent status and settings writes fail or
// succeed each on its own: open must return a fresh, empty store in which
// a status write with text Poison fails (a trigger the test installed).
// Every poisoned write fails and writes nothing; every other one succeeds,
// even when the backend committed it together with poisoned ones.
func RunPoisoned(t *testing.T, open func(t *testing.T) Store) {
	s := open(t)
	t.Cleanup(func() { s.Close() })
	ctx := t.Context()
	const writers = 48
	for round := range 3 {
		var wg sync.WaitGroup
		errs := make([]error, writers)
		for g := range writers {
			wg.Go(func() {
				user := fmt.Sprintf("p%d-%02d", round, g)
				switch g % 3 {
				case 0:
					errs[g] = s.SaveStatus(ctx, user, presence.ManualBusy, Poison)
				case 1:
					errs[g] = s.SaveStatus(ctx, user, presence.ManualBusy, "fine")
				case 2:
					errs[g] = s.SaveSettings(ctx, user, presence.Settings{Status: presence.Contacts})
				}
			})
		}
		wg.Wait()
		var ids []string
		for g := range writers {
			ids = append(ids, fmt.Sprintf("p%d-%02d", round, g))
		}
		got := load(t, s, ids...)
		for g, err := range errs {
			user := ids[g]
			_, found := got[user]
			if g%3 == 0 {
				if err == nil || found {
					t.Errorf("%s, poisoned: got error %v, written %v; want an error and nothing written", user, err, found)
				}
				continue
			}
			if err != nil || !found {
				t.Errorf("%s: got error %v, written %v; want nil and written", user, err, found)
			}
		}
	}
}

func testContacts(t *testing.T, s Store) {
	ctx := t.Context()
	const u = "owner"
	steps := []struct {
		name string
		op   func() error
		want []string
	}{
		{"unknown user", nil, []string{}},
		{"set sorts", func() error { return s.SetContacts(ctx, u, []string{"b", "a", "c"}) }, []string{"a", "b", "c"}},
		{"set replaces", func() error { return s.SetContacts(ctx, u, []string{"d", "c"}) }, []string{"c", "d"}},
		{"set same again", func() error { return s.SetContacts(ctx, u, []string{"c", "d"}) }, []string{"c", "d"}},
		{"add", func() error { return s.AddContacts(ctx, u, []string{"e", "a"}) }, []string{"a", "c", "d", "e"}},
		{"add listed and new", func() error { return s.AddContacts(ctx, u, []string{"a", "c", "f"}) }, []string{"a", "c", "d", "e", "f"}},
		{"add again", func() error { return s.AddContacts(ctx, u, []string{"a", "c", "f"}) }, []string{"a", "c", "d", "e", "f"}},
		{"add duplicates", func() error { return s.AddContacts(ctx, u, []string{"g", "g"}) }, []string{"a", "c", "d", "e", "f", "g"}},
		{"add nothing", func() error { return s.AddContacts(ctx, u, nil) }, []string{"a", "c", "d", "e", "f", "g"}},
		{"remove", func() error { return s.RemoveContacts(ctx, u, []string{"a", "g"}) }, []string{"c", "d", "e", "f"}},
		{"remove unlisted", func() error { return s.RemoveContacts(ctx, u, []string{"a", "zz"}) }, []string{"c", "d", "e", "f"}},
		{"remove nothing", func() error { return s.RemoveContacts(ctx, u, []string{}) }, []string{"c", "d", "e", "f"}},
		{"set duplicates", func() error { return s.SetContacts(ctx, u, []string{"z", "y", "z"}) }, []string{"y", "z"}},
		{"set empty", func() error { return s.SetContacts(ctx, u, []string{}) }, []string{}},
		{"add after empty", func() error { return s.AddContacts(ctx, u, []string{"x"}) }, []string{"x"}},
		{"set nil", func() error { return s.SetContacts(ctx, u, nil) }, []string{}},
		{"byte order", func() error { return s.SetContacts(ctx, u, []string{"a", "B", "9", "10", "é", "Z", "_"}) },
			[]string{"10", "9", "B", "Z", "_", "a", "é"}},
		{"odd ids", func() error { return s.SetContacts(ctx, u, odd) }, slices.Sorted(slices.Values(odd))},
		{"remove all", func() error { return s.RemoveContacts(ctx, u, odd) }, []string{}},
	}
	for _, st := range steps {
		if st.op != nil {
			if err := st.op(); err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
		}
		got, err := s.Contacts(ctx, u)
		if err != nil {
			t.Fatalf("%s: Contacts: %v", st.name, err)
		}
		if got == nil || !slices.Equal(got, st.want) {
			t.Errorf("%s: Contacts = %#v, want %#v", st.name, got, st.want)
		}
	}
}

func testContactsPerUser(t *testing.T, s Store) {
	ctx := t.Context()
	if err := s.SetContacts(ctx, "a", []string{"b", "c"}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetContacts(ctx, "b", []string{"a"}); err != nil {
		t.Fatal(err)
	}
	// Contact lists have nothing to do with profiles.
	if got := load(t, s, "a", "b"); len(got) != 0 {
		t.Errorf("contact lists created profiles %v", got)
	}
	if err := s.SetContacts(ctx, "a", []string{"d"}); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveContacts(ctx, "c", []string{"a"}); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"a": {"d"}, "b": {"a"}, "c": {}, "d": {}}
	for u, w := range want {
		if got := contacts(t, s, u); !slices.Equal(got, w) {
			t.Errorf("Contacts(%q) = %q, want %q", u, got, w)
		}
	}
}

func testListedBy(t *testing.T, s Store) {
	ctx := t.Context()
	lists := map[string][]string{
		"o1": {"v", "w"},
		"o2": {"w"},
		"o3": {"v"},
		"o4": {},
		"o5": {"v", "x", "o1"},
		"v":  {"o1", "o2"}, // the other way round does not count
	}
	for owner, l := range lists {
		if err := s.SetContacts(ctx, owner, l); err != nil {
			t.Fatalf("SetContacts(%q): %v", owner, err)
		}
	}
	all := []string{"o1", "o2", "o3", "o4", "o5", "o6", "v"}
	tests := []struct {
		viewer string
		owners []string
		want   []string
	}{
		{"v", all, []string{"o1", "o3", "o5"}},
		{"v", []string{"o2", "o4"}, nil},
		{"v", []string{"o5"}, []string{"o5"}},
		{"v", nil, nil},
		{"v", []string{}, nil},
		{"w", all, []string{"o1", "o2"}},
		{"o1", all, []string{"o5", "v"}},
		{"nobody", all, nil},
		{"V", all, nil},
		{"", all, nil},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s in %d", tc.viewer, len(tc.owners)), func(t *testing.T) {
			if got := listedBy(t, s, tc.viewer, tc.owners); !slices.Equal(got, tc.want) {
				t.Errorf("ListedBy(%q, %q) = %q, want %q", tc.viewer, tc.owners, got, tc.want)
			}
		})
	}
}

// testListedByManyOwners asks about more owners in one call than SQLite
// takes variables in one statement, with matches on both sides of every
// likely chunk border.
func testListedByManyOwners(t *testing.T, s Store) {
	ctx := t.Context()
	const n = 2500
	owners := make([]string, n)
	for i := range owners {
		owners[i] = fmt.Sprintf("owner%05d", i)
	}
	var want []string
	for _, i := range []int{0, 1, 497, 498, 499, 500, 997, 998, 999, 1000, 1996, 1997, 1998, 1999, 2000, 2499} {
		if err := s.AddContacts(ctx, owners[i], []string{"v", "other"}); err != nil {
			t.Fatalf("AddContacts(%q): %v", owners[i], err)
		}
		want = append(want, owners[i])
	}
	for _, i := range []int{2, 1001, 2498} {
		if err := s.AddContacts(ctx, owners[i], []string{"other"}); err != nil {
			t.Fatalf("AddContacts(%q): %v", owners[i], err)
		}
	}
	if got := listedBy(t, s, "v", owners); !slices.Equal(got, want) {
		t.Errorf("ListedBy(v, %d owners) = %q, want %q", n, got, want)
	}
	rev := slices.Clone(owners)
	slices.Reverse(rev)
	if got := listedBy(t, s, "v", rev); !slices.Equal(got, want) {
		t.Errorf("ListedBy(v, %d owners reversed) = %q, want %q", n, got, want)
	}
}

// testContactLimit: no change may take a list past presence.MaxContacts,
// not even concurrent additions; a refused change changes nothing.
func testContactLimit(t *testing.T, s Store) {
	ctx := context.Background()
	full := make([]string, presence.MaxContacts)
	for i := range full {
		full[i] = fmt.Sprintf("c%05d", i)
	}
	if err := s.SetContacts(ctx, "u", full[:presence.MaxContacts-1]); err != nil {
		t.Fatalf("SetContacts(%d): %v", presence.MaxContacts-1, err)
	}
	over := append(append([]string(nil), full...), "extra")
	if err := s.SetContacts(ctx, "u", over); !errors.Is(err, presence.ErrTooManyContacts) {
		t.Fatalf("SetContacts(%d) = %v, want ErrTooManyContacts", len(over), err)
	}
	if got := len(contacts(t, s, "u")); got != presence.MaxContacts-1 {
		t.Fatalf("after a refused SetContacts the list holds %d, want %d (unchanged)", got, presence.MaxContacts-1)
	}
	// Twenty concurrent single additions: exactly one fits.
	var wg sync.WaitGroup
	var ok, refused atomic.Int32
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := unbusy(func() error { return s.AddContacts(ctx, "u", []string{fmt.Sprintf("new%02d", i)}) })
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, presence.ErrTooManyContacts):
				refused.Add(1)
			default:
				t.Errorf("AddContacts: %v", err)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 1 || refused.Load() != 19 {
		t.Errorf("concurrent additions at the limit: %d accepted, %d refused; want 1 and 19", ok.Load(), refused.Load())
	}
	if got := len(contacts(t, s, "u")); got != presence.MaxContacts {
		t.Errorf("list holds %d, want %d", got, presence.MaxContacts)
	}
}

// unbusy calls write again while it fails with writegate.ErrBusy (a
// bounded queue of contact-list writes was full: nothing was written).
func unbusy(write func() error) error {
	for {
		err := write()
		if !errors.Is(err, writegate.ErrBusy) {
			return err
		}
		time.Sleep(time.Millisecond)
	}
}

// testEpochGrows: every run gets a larger epoch.
func testEpochGrows(t *testing.T, s Store) {
	ctx := context.Background()
	var prev uint64
	for i := range 3 {
		e, err := s.NextEpoch(ctx)
		if err != nil {
			t.Fatalf("NextEpoch: %v", err)
		}
		if e <= prev {
			t.Fatalf("NextEpoch #%d = %d, want > %d", i+1, e, prev)
		}
		prev = e
	}
}

func testPingAndClose(t *testing.T, s Store) {
	ctx := t.Context()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping of an open store: %v", err)
	}
	for i := range 3 {
		if err := s.Close(); err != nil {
			t.Errorf("Close #%d: %v", i+1, err)
		}
	}
	if err := s.Ping(ctx); err == nil {
		t.Errorf("Ping of a closed store: got nil error, want one")
	}
}

// stored is what a durable store reads back of a profile written whole
// (save): the public face kept where Profile.Frozen says so, none
// otherwise.
func stored(p presence.Profile) presence.Profile {
	if p.Frozen() {
		p.PubText, p.PubVersion = p.Public()
	} else {
		p.PubText, p.PubVersion = "", 0
	}
	return p
}

// save writes every durable field of p through the three writes.
func save(t *testing.T, s Store, p *presence.Profile) {
	t.Helper()
	ctx := t.Context()
	if err := s.SaveStatus(ctx, p.UserID, p.Manual, p.Text); err != nil {
		t.Fatalf("SaveStatus(%q): %v", p.UserID, err)
	}
	if err := s.SaveSettings(ctx, p.UserID, p.Settings); err != nil {
		t.Fatalf("SaveSettings(%q): %v", p.UserID, err)
	}
	if err := s.SaveLastSeen(ctx, []presence.Profile{*p}); err != nil {
		t.Fatalf("SaveLastSeen(%q): %v", p.UserID, err)
	}
}

// load returns the profiles LoadProfiles reports for ids (distinct), failing
// the test if it reports an id twice or one it was not asked for.
func load(t *testing.T, s Store, ids ...string) map[string]presence.Profile {
	t.Helper()
	asked := make(map[string]bool, len(ids))
	for _, id := range ids {
		asked[id] = true
	}
	got := make(map[string]presence.Profile)
	err := s.LoadProfiles(t.Context(), ids, func(p *presence.Profile) {
		if !asked[p.UserID] {
			t.Errorf("LoadProfiles reported %q, which it was not asked for", p.UserID)
		}
		if _, dup := got[p.UserID]; dup {
			t.Errorf("LoadProfiles reported %q twice", p.UserID)
		}
		got[p.UserID] = *p
	})
	if err != nil {
		t.Fatalf("LoadProfiles(%d ids): %v", len(ids), err)
	}
	return got
}

func contacts(t *testing.T, s Store, user string) []string {
	t.Helper()
	got, err := s.Contacts(t.Context(), user)
	if err != nil {
		t.Fatalf("Contacts(%q): %v", user, err)
	}
	if got == nil {
		t.Errorf("Contacts(%q) = nil, want a non-nil slice", user)
	}
	return got
}

// listedBy returns what ListedBy reports, sorted, failing the test on an
// owner reported twice or not asked about.
func listedBy(t *testing.T, s Store, viewer string, owners []string) []string {
	t.Helper()
	asked := make(map[string]bool, len(owners))
	for _, o := range owners {
		asked[o] = true
	}
	var got []string
	err := s.ListedBy(t.Context(), viewer, owners, func(owner string) {
		if !asked[owner] {
			t.Errorf("ListedBy(%q) reported %q, which it was not asked about", viewer, owner)
		}
		got = append(got, owner)
	})
	if err != nil {
		t.Fatalf("ListedBy(%q, %d owners): %v", viewer, len(owners), err)
	}
	slices.Sort(got)
	if c := slices.Compact(slices.Clone(got)); len(c) != len(got) {
		t.Errorf("ListedBy(%q) reported an owner twice: %q", viewer, got)
	}
	return got
}

func head(s []string) []string { return s[:min(len(s), 5)] }

// RunReopen checks that everything written survives a Close and another
// open of the same storage: profiles, contact lists and the epoch. open must
// open the same file or database every time it is called. It returns the
// reopened store, for backend-specific checks.
func RunReopen(t *testing.T, open func(t *testing.T) Store) Store {
	t.Helper()
	ctx := context.Background()
	want := []presence.Profile{
		{UserID: "1", Manual: presence.ManualInvisible, Text: "zzz 😴", LastSeen: 1_700_000_000_123, PubLastSeen: 1_700_000_000_000,
			Version: 1_700_000_000_123_000, Settings: presence.Settings{Status: presence.Contacts, LastSeen: presence.Nobody}},
		{UserID: "2", LastSeen: 5, PubLastSeen: 5, Version: 6},
	}
	s := open(t)
	for i := range want {
		p := &want[i]
		if err := s.SaveStatus(ctx, p.UserID, p.Manual, p.Text); err != nil {
			t.Fatal(err)
		}
		if err := s.SaveSettings(ctx, p.UserID, p.Settings); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SaveLastSeen(ctx, want); err != nil {
		t.Fatal(err)
	}
	if err := s.SetContacts(ctx, "1", []string{"3", "2"}); err != nil {
		t.Fatal(err)
	}
	e1, err := s.NextEpoch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	s = open(t)
	got := load(t, s, "1", "2", "3")
	for _, w := range want {
		if g, ok := got[w.UserID]; !ok || g != stored(w) {
			t.Errorf("after reopen %s:\n got %+v\nwant %+v", w.UserID, g, stored(w))
		}
	}
	if len(got) != len(want) {
		t.Errorf("after reopen %d profiles, want %d", len(got), len(want))
	}
	if c := contacts(t, s, "1"); !slices.Equal(c, []string{"2", "3"}) {
		t.Errorf("after reopen Contacts(1) = %q, want [2 3]", c)
	}
	if e2, err := s.NextEpoch(ctx); err != nil || e2 != e1+1 {
		t.Errorf("after reopen NextEpoch = %d, %v; want %d", e2, err, e1+1)
	}
	return s
}

// BenchStatus measures SaveStatus, the durable write a set_status waits
// for: one writer at a time (the latency one change pays), and many at once
// (what concurrent changes of different users cost together). Every write
// really changes its row. open must return a fresh, empty store.
func BenchStatus(b *testing.B, open func(b *testing.B) Store) {
	for _, writers := range []int{1, 16, 128} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			s := open(b)
			b.Cleanup(func() { s.Close() })
			ctx := context.Background()
			for w := range writers {
				if err := s.SaveStatus(ctx, fmt.Sprintf("u%d", w), presence.ManualBusy, ""); err != nil {
					b.Fatal(err)
				}
			}
			var next atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			var wg sync.WaitGroup
			errs := make(chan error, writers)
			for w := range writers {
				wg.Go(func() {
					user := fmt.Sprintf("u%d", w)
					for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
						m := presence.ManualBusy
						if i%2 == 0 {
							m = presence.ManualAway
						}
						if err := s.SaveStatus(ctx, user, m, fmt.Sprint(i)); err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
		})
	}
}

// BenchSetContacts measures SetContacts of a 10,000-entry list: "swap"
// alternates between two disjoint lists, so every replacement removes and
// inserts 10,000 rows (the worst case), "same" sends the list the user
// has already (a backend that re-sends its whole list). open must return
// a fresh, empty store.
func BenchSetContacts(b *testing.B, open func(b *testing.B) Store) {
	const n = 10_000
	var lists [2][]string
	for i := range n {
		lists[0] = append(lists[0], fmt.Sprintf("a%d", i))
		lists[1] = append(lists[1], fmt.Sprintf("b%d", i))
	}
	for _, swap := range []bool{true, false} {
		name := "same"
		if swap {
			name = "swap"
		}
		b.Run(name, func(b *testing.B) {
			s := open(b)
			b.Cleanup(func() { s.Close() })
			ctx := context.Background()
			if err := s.SetContacts(ctx, "owner", lists[0]); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				l := lists[0]
				if swap {
					l = lists[i%2]
				}
				if err := s.SetContacts(ctx, "owner", l); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
