// Package benchfix builds the populations the benchmarks of several
// packages share: a memory store holding a million online users, and
// in-memory stand-ins for the durable store that keep nothing, so that a
// benchmark measures the hot path rather than SQLite.
package benchfix

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/presence"
)

// Nop is a durable store with no records: every method succeeds at once.
// It is safe for concurrent use.
type Nop struct{}

// LoadProfiles finds nothing.
func (Nop) LoadProfiles(context.Context, []string, func(*presence.Profile)) error { return nil }

// SaveStatus keeps nothing.
func (Nop) SaveStatus(context.Context, string, presence.Manual, string) error { return nil }

// SaveSettings keeps nothing.
func (Nop) SaveSettings(context.Context, string, presence.Settings) error { return nil }

// SaveLastSeen keeps nothing.
func (Nop) SaveLastSeen(context.Context, []presence.Profile) error { return nil }

// ListedBy finds no contact.
func (Nop) ListedBy(context.Context, string, []string, func(string)) error { return nil }

// SetContacts keeps nothing.
func (Nop) SetContacts(context.Context, string, []string) error { return nil }

// AddContacts keeps nothing.
func (Nop) AddContacts(context.Context, string, []string) error { return nil }

// RemoveContacts keeps nothing.
func (Nop) RemoveContacts(context.Context, string, []string) error { return nil }

// Contacts finds none.
func (Nop) Contacts(context.Context, string) ([]string, error) { return []string{}, nil }

var (
	idsOnce sync.Once
	idList  []string
)

// IDs returns n user ids ("100000000", "100000001", …), n ≤ 1<<20.
func IDs(n int) []string {
	idsOnce.Do(func() {
		idList = make([]string, 1<<20)
		for i := range idList {
			idList[i] = strconv.Itoa(100000000 + i)
		}
	})
	return idList[:n]
}

// Population returns a memory store holding n online users with one
// device each, beating at now; a tenth of them idle (away) and a tenth
// busy, so reads see every status.
func Population(n int, now time.Time) *memstore.Store {
	rules := presence.Rules{TTL: time.Hour, IdleAfter: 5 * time.Minute}
	s := memstore.New(memstore.Config{Rules: rules})
	ctx := context.Background()
	ms := now.UnixMilli()
	for i, id := range IDs(n) {
		p := presence.Profile{UserID: id}
		if i%10 == 1 {
			p.Manual = presence.ManualBusy
		}
		_ = s.Load(ctx, ms, &p)
		at := ms
		if i%10 == 2 {
			at = ms - (10 * time.Minute).Milliseconds() // idle: away
		}
		_, _ = s.Beat(ctx, at, id, "d", true)
	}
	runtime.GC() // the set-up's garbage must not be collected on the clock
	return s
}

// Sample returns k distinct random ids out of the first n.
func Sample(r *rand.Rand, n, k int) []string {
	all := IDs(n)
	seen := make(map[int]struct{}, k)
	out := make([]string, 0, k)
	for len(out) < k {
		i := r.IntN(n)
		if _, ok := seen[i]; ok {
			continue
		}
		seen[i] = struct{}{}
		out = append(out, all[i])
	}
	return out
}
