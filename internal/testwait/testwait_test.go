package testwait

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestPollReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int32
	if !poll(time.Minute, func() bool { return n.Add(1) == 5 }) {
		t.Fatal("poll gave up on a condition that came true")
	}
	if got := n.Load(); got != 5 {
		t.Errorf("cond called %d times, want 5 (it must stop once it holds)", got)
	}
}

func TestPollGivesUpAfterTheDeadline(t *testing.T) {
	calls := 0
	if poll(30*time.Millisecond, func() bool { calls++; return false }) {
		t.Fatal("poll reported a condition that never held")
	}
	if calls < 2 {
		t.Errorf("cond called %d times in 30 ms, want it polled", calls)
	}
}

func TestHelpersPassWhenTheConditionHolds(t *testing.T) {
	For(t, "true", func() bool { return true })
	Forf(t, func() string { return "true" }, func() bool { return true })
	n := 0
	NoErr(t, "third try", func() error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	})
}
