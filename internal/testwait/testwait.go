// Package testwait lets a test wait for what another goroutine, process
// or server makes true, without guessing a sleep: it polls a condition
// with a short backoff and fails the test, naming what it waited for,
// once Timeout has passed. NothingWithin is the fixed wait of a test that
// checks that something does not happen.
package testwait

import (
	"testing"
	"time"
)

// Timeout is how long For waits before it fails the test. It is long
// because this is a ceiling on a shared, noisy machine, not a speed
// requirement: a condition that holds returns as soon as it is seen.
const Timeout = 20 * time.Second

// For polls cond until it holds, and fails t naming what after Timeout.
func For(t testing.TB, what string, cond func() bool) {
	t.Helper()
	Forf(t, func() string { return what }, cond)
}

// Forf is For whose description is computed when it fails, so it can
// say what was seen last.
func Forf(t testing.TB, what func() string, cond func() bool) {
	t.Helper()
	if !poll(Timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", Timeout, what())
	}
}

// NoErr polls f until it returns nil, and fails t with the last error
// after Timeout.
func NoErr(t testing.TB, what string, f func() error) {
	t.Helper()
	var last error
	if !poll(Timeout, func() bool { last = f(); return last == nil }) {
		t.Fatalf("%s: still %v after %v", what, last, Timeout)
	}
}

// NothingWithin is the one fixed wait a test keeps: it waits d, the time
// within which what, which must not happen (a duplicate, a false
// offline, a change sent to the wrong watcher), would have happened if it
// were going to. No event stands for something that does not come; the
// test checks afterwards that it did not.
func NothingWithin(d time.Duration, what string) {
	_ = what // named at the call site, for the reader
	time.Sleep(d)
}

// poll reports whether cond held within d, checking at first every
// millisecond and backing off to every 20 ms.
func poll(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for pause := time.Millisecond; !cond(); pause = min(2*pause, 20*time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause)
	}
	return true
}
