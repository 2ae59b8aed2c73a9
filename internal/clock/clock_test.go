package clock_test

import (
	"testing"
	"time"

	"github.com/presenced/presenced/internal/clock"
)

func fired(tm clock.Timer) bool {
	select {
	case <-tm.C():
		return true
	default:
		return false
	}
}

// A fake clock's timer fires when the clock is moved to its time, once;
// Reset re-arms it and drops a fire not received; Stop disarms it.
func TestFakeTimer(t *testing.T) {
	start := time.Unix(1000, 0)
	f := clock.NewFake(start)
	tm := clock.NewTimer(f, 150*time.Millisecond)
	f.Advance(149 * time.Millisecond)
	if fired(tm) {
		t.Fatal("fired 1ms before its time")
	}
	f.Advance(time.Millisecond)
	if !fired(tm) {
		t.Fatal("did not fire at its time")
	}
	f.Advance(time.Second)
	if fired(tm) {
		t.Fatal("fired twice")
	}
	tm.Reset(10 * time.Millisecond)
	f.Set(start.Add(2 * time.Second))
	tm.Reset(100 * time.Millisecond) // the fire at +10ms is dropped
	if fired(tm) {
		t.Fatal("a fire from before Reset was kept")
	}
	tm.Stop()
	f.Advance(time.Hour)
	if fired(tm) {
		t.Fatal("fired after Stop")
	}
	tm.Reset(0)
	if !fired(tm) {
		t.Fatal("Reset(0) did not fire at once")
	}
}

// Without timers of its own a clock gets the wall clock's.
func TestRealTimer(t *testing.T) {
	tm := clock.NewTimer(clock.Real{}, time.Millisecond)
	<-tm.C()
	tm.Reset(time.Hour)
	tm.Stop()
}

// ResetAt arms a fake timer for the moment itself, however the clock
// moved since its owner read it: one armed for a moment passed fires at
// once, one ahead fires when the clock gets there.
func TestFakeResetAt(t *testing.T) {
	t0 := time.UnixMilli(1_000_000)
	f := clock.NewFake(t0)
	tm := clock.NewTimer(f, time.Hour)
	tm.Stop()
	f.Set(t0.Add(150 * time.Millisecond)) // moved after the owner read t0
	clock.ResetAt(f, tm, t0.Add(150*time.Millisecond))
	select {
	case <-tm.C():
	default:
		t.Fatal("a timer armed for the clock's moment did not fire")
	}
	clock.ResetAt(f, tm, t0.Add(300*time.Millisecond))
	f.Set(t0.Add(299 * time.Millisecond))
	select {
	case <-tm.C():
		t.Fatal("fired before its moment")
	default:
	}
	f.Set(t0.Add(300 * time.Millisecond))
	select {
	case <-tm.C():
	default:
		t.Fatal("did not fire at its moment")
	}
}
