package backendcall

import (
	"context"
	"testing"
	"time"
)

func TestObserveBuckets(t *testing.T) {
	o := New("test", "observe_buckets")
	if New("test", "observe_buckets") != o {
		t.Fatal("New made a second Op for the same backend and name")
	}
	o.Observe(10 * time.Microsecond)  // ≤ 25µs
	o.Observe(25 * time.Microsecond)  // ≤ 25µs (le is inclusive)
	o.Observe(300 * time.Microsecond) // ≤ 500µs
	o.Observe(time.Minute)            // +Inf only
	var s *Snapshot
	for _, x := range Snapshots() {
		if x.Backend == "test" && x.Op == "observe_buckets" {
			s = &x
		}
	}
	if s == nil {
		t.Fatal("no snapshot of the op")
	}
	if s.Count != 4 {
		t.Errorf("count %d, want 4", s.Count)
	}
	for le, want := range map[float64]uint64{.000025: 2, .00025: 2, .0005: 3, 2.5: 3} {
		if got := s.Buckets[le]; got != want {
			t.Errorf("bucket le=%g: %d, want %d", le, got, want)
		}
	}
	if want := (time.Minute + 335*time.Microsecond).Seconds(); s.Sum != want {
		t.Errorf("sum %g, want %g", s.Sum, want)
	}
}

func TestUnusedOpNotExported(t *testing.T) {
	New("test", "never_called")
	for _, s := range Snapshots() {
		if s.Op == "never_called" {
			t.Fatal("an op without calls is exported")
		}
	}
}

func TestCallNoAlloc(t *testing.T) {
	o := New("test", "alloc")
	ctx := context.Background()
	if n := testing.AllocsPerRun(100, func() { o.Start(ctx).End(nil) }); n != 0 {
		t.Errorf("a call allocates %v times", n)
	}
	deferred := func() (err error) {
		defer o.Start(ctx).Done(&err)
		return nil
	}
	if n := testing.AllocsPerRun(100, func() { _ = deferred() }); n != 0 {
		t.Errorf("a deferred call allocates %v times", n)
	}
	if o.Count() == 0 {
		t.Error("calls not counted")
	}
}

func BenchmarkCall(b *testing.B) {
	o := New("test", "bench")
	ctx := context.Background()
	for b.Loop() {
		o.Start(ctx).End(nil)
	}
}
