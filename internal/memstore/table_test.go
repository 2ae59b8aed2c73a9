package memstore

import (
	"hash/maphash"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/presenced/presenced/internal/presence"
)

// TestTableAgainstMap adds and removes random ids — short ones held
// inline, long ones sharing their first idHead bytes, so only the arena
// tells them apart — and checks after every step that the table finds
// exactly what a map holds: backward-shift deletion keeps every probe run
// whole, growth re-places every slot, the arena's compaction moves every
// id and device id.
func TestTableAgainstMap(t *testing.T) {
	seed := maphash.MakeSeed()
	var tb table
	tb.init(seed, 0, presence.DefaultMaxDevices)
	rng := rand.New(rand.NewPCG(7, 9))
	want := map[string]int{} // id → index
	devs := map[string]string{}
	id := func() string {
		n := rng.IntN(300)
		switch rng.IntN(3) {
		case 0:
			return strconv.Itoa(n)
		case 1:
			return strings.Repeat("p", idHead) + strconv.Itoa(n) // same first idHead bytes
		}
		return strings.Repeat("q", idHead-2) + strconv.Itoa(n) // straddles the inline head
	}
	check := func(step int) {
		t.Helper()
		if tb.n != len(want) {
			t.Fatalf("step %d: table holds %d users, map %d", step, tb.n, len(want))
		}
		for k, idx := range want {
			if got := tb.find(maphash.String(seed, k), k); got != idx {
				t.Fatalf("step %d: find(%q) = %d, want %d", step, k, got, idx)
			}
			r := &tb.recs[idx]
			if got := tb.str(r.id()); got != k {
				t.Fatalf("step %d: record %d holds id %q, want %q", step, idx, got, k)
			}
			if got := tb.str(r.dev.id); got != devs[k] {
				t.Fatalf("step %d: %q's device is %q, want %q", step, k, got, devs[k])
			}
		}
		for range 20 {
			if k := id(); want[k] == 0 {
				if _, ok := want[k]; !ok && tb.find(maphash.String(seed, k), k) >= 0 {
					t.Fatalf("step %d: found %q, which is not held", step, k)
				}
			}
		}
	}
	for step := range 20000 {
		k := id()
		h := maphash.String(seed, k)
		if idx, ok := want[k]; ok {
			if rng.IntN(2) == 0 {
				tb.remove(h, idx)
				delete(want, k)
				delete(devs, k)
			} else {
				// A new device id: the old one becomes garbage.
				d := "device-" + strconv.Itoa(rng.IntN(1000))
				u, tx := tb.inflate(idx, k)
				u.Devices = append(u.Devices[:0], presence.Device{ID: d, LastBeat: int64(step)})
				tb.store(idx, &u, tx)
				devs[k] = d
			}
		} else {
			want[k] = tb.add(h, k)
			devs[k] = ""
		}
		if step%97 == 0 {
			check(step)
		}
	}
	check(-1)
	if tb.compactions == 0 {
		t.Error("the arena was never compacted: the test did not exercise it")
	}
	if len(tb.slots) > 8*len(want)+64 {
		t.Errorf("%d slots for %d users", len(tb.slots), len(want))
	}
}

// TestTableHoldsNoPointers keeps records free of pointers, which is what
// spares the collector from scanning a table of a million users.
func TestTableHoldsNoPointers(t *testing.T) {
	if p := pointerPath(reflect.TypeFor[rec](), "rec"); p != "" {
		t.Fatalf("%s holds a pointer: the collector would scan every user", p)
	}
	if pointerPath(reflect.TypeFor[texts](), "texts") == "" {
		t.Fatal("pointerPath does not see a string")
	}
}

// pointerPath names a field of typ that holds a pointer, or is "".
func pointerPath(typ reflect.Type, path string) string {
	switch typ.Kind() {
	case reflect.Pointer, reflect.String, reflect.Slice, reflect.Map, reflect.Chan,
		reflect.Func, reflect.Interface, reflect.UnsafePointer:
		return path
	case reflect.Array:
		return pointerPath(typ.Elem(), path+"[]")
	case reflect.Struct:
		for i := range typ.NumField() {
			f := typ.Field(i)
			if p := pointerPath(f.Type, path+"."+f.Name); p != "" {
				return p
			}
		}
	}
	return ""
}

// TestRecordSize keeps a record at two cache lines: a read touches both,
// and a third would be a third miss per user.
func TestRecordSize(t *testing.T) {
	if n := unsafe.Sizeof(rec{}); n != 128 {
		t.Errorf("a record is %d bytes, want 128", n)
	}
}
