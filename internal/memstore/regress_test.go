package memstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/presence"
)

// TestCompactionDuringAdd: the arena of a shard is small (one short id
// and a device id), half of it is garbage (the device said bye), and a user
// whose id is longer than the arena's capacity is loaded. add marks the new
// record live with idLen set before interning its id; intern compacts, and
// compact copies the new record's id span {off 0, n idLen} — beyond the old
// arena's capacity.
func TestCompactionDuringAdd(t *testing.T) {
	ctx := context.Background()
	s := memstore.New(memstore.Config{Rules: rules, Shards: 1})
	const t0 = 1_700_000_000_000
	if err := s.Load(ctx, t0, &presence.Profile{UserID: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Beat(ctx, t0, "a", "dev1", true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Bye(ctx, t0+1, "a", "dev1"); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("L", 60)
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("Load(%d-byte id) after a bye in a small arena panicked: %v", len(long), r)
			}
		}()
		if err := s.Load(ctx, t0+2, &presence.Profile{UserID: long}); err != nil {
			t.Fatal(err)
		}
	}()
	var out [2]presence.Snapshot
	if err := s.Get(ctx, t0+3, []string{"a", long}, out[:]); err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"a", long} {
		if !out[i].Known || out[i].UserID != id {
			t.Errorf("Get(%q) = %+v, want the user known", id, out[i])
		}
	}
}

// TestManyDevices: -max-devices has no upper bound, but a record
// counts its devices in a uint8. A user with 256 alive devices must show
// 256 devices, not 0 (offline).
func TestManyDevices(t *testing.T) {
	ctx := context.Background()
	r := presence.Rules{TTL: time.Hour, MaxDevices: 300}.WithDefaults()
	s := memstore.New(memstore.Config{Rules: r, Shards: 1})
	const t0 = 1_700_000_000_000
	if err := s.Load(ctx, t0, &presence.Profile{UserID: "u"}); err != nil {
		t.Fatal(err)
	}
	for i := range 256 {
		if _, err := s.Beat(ctx, t0, "u", fmt.Sprint("d", i), true); err != nil {
			t.Fatalf("beat %d: %v", i, err)
		}
	}
	var out [1]presence.Snapshot
	if err := s.Get(ctx, t0+1, []string{"u"}, out[:]); err != nil {
		t.Fatal(err)
	}
	if out[0].Devices != 256 || out[0].Status != presence.Online {
		t.Errorf("after 256 devices beat: %d devices, status %v; want 256, online", out[0].Devices, out[0].Status)
	}
}
