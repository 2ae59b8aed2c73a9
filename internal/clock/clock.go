// Package clock provides the time source used by presenced. Production code
// uses Real; tests use Fake to play hours of presence in milliseconds.
package clock

import (
	"sync"
	"time"
)

// Clock tells the current time. Implementations are safe for concurrent use.
type Clock interface {
	Now() time.Time
}

// Real is the wall clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// Timer is a one-shot timer of a Clock: C receives the time once the
// clock reaches the moment it is armed for. Reset re-arms it (a fire not
// received yet is dropped); Stop disarms it. A Timer is used by one
// goroutine at a time.
type Timer interface {
	C() <-chan time.Time
	Reset(d time.Duration)
	Stop()
}

// Timers is implemented by a Clock that makes its own timers (Fake: they
// fire when the clock is moved past them).
type Timers interface {
	NewTimer(d time.Duration) Timer
}

// NewTimer returns a timer of c armed d from now: c's own if c
// implements Timers, otherwise the wall clock's.
func NewTimer(c Clock, d time.Duration) Timer {
	if ts, ok := c.(Timers); ok {
		return ts.NewTimer(d)
	}
	return realTimer{time.NewTimer(d)}
}

// ResetAt re-arms t, a timer of c, for the moment at: a Fake's timer
// exactly, whatever the clock does meanwhile; another for at minus c's
// time now.
func ResetAt(c Clock, t Timer, at time.Time) {
	if ft, ok := t.(*fakeTimer); ok {
		ft.f.mu.Lock()
		defer ft.f.mu.Unlock()
		ft.drainLocked()
		ft.at, ft.armed = at, true
		ft.f.fireLocked()
		return
	}
	t.Reset(at.Sub(c.Now()))
}

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time { return r.t.C }

// Reset re-arms the timer; since Go 1.23 a fire not received is dropped.
func (r realTimer) Reset(d time.Duration) { r.t.Reset(d) }
func (r realTimer) Stop()                 { r.t.Stop() }

// Fake is a manually driven clock. The zero value is not usable; use NewFake.
// Fake is safe for concurrent use.
type Fake struct {
	mu     sync.Mutex // guards the fields below
	now    time.Time
	timers []*fakeTimer // every timer made, armed or not
}

// NewFake returns a Fake clock set to t.
func NewFake(t time.Time) *Fake { return &Fake{now: t} }

// Now returns the fake current time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Advance moves the clock forward by d and returns the new time.
func (f *Fake) Advance(d time.Duration) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	f.fireLocked()
	return f.now
}

// Set moves the clock to t.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = t
	f.fireLocked()
}

// NewTimer returns a timer that fires once the clock is moved to d after
// its current time or later (at once if d <= 0).
func (f *Fake) NewTimer(d time.Duration) Timer {
	ft := &fakeTimer{f: f, c: make(chan time.Time, 1)}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.timers = append(f.timers, ft)
	ft.armLocked(d)
	return ft
}

// fireLocked fires every armed timer whose time has come.
func (f *Fake) fireLocked() {
	for _, ft := range f.timers {
		if ft.armed && !ft.at.After(f.now) {
			ft.armed = false
			select {
			case ft.c <- f.now:
			default:
			}
		}
	}
}

// fakeTimer is a Timer of a Fake clock; its fields are guarded by f.mu.
type fakeTimer struct {
	f     *Fake
	c     chan time.Time // capacity 1
	at    time.Time
	armed bool
}

func (ft *fakeTimer) C() <-chan time.Time { return ft.c }

func (ft *fakeTimer) Reset(d time.Duration) {
	ft.f.mu.Lock()
	defer ft.f.mu.Unlock()
	ft.armLocked(d)
}

func (ft *fakeTimer) Stop() {
	ft.f.mu.Lock()
	defer ft.f.mu.Unlock()
	ft.armed = false
	ft.drainLocked()
}

func (ft *fakeTimer) armLocked(d time.Duration) {
	ft.drainLocked()
	ft.at, ft.armed = ft.f.now.Add(d), true
	ft.f.fireLocked()
}

func (ft *fakeTimer) drainLocked() {
	select {
	case <-ft.c:
	default:
	}
}
