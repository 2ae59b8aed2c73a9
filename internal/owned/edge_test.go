package owned

import (
	"testing"
	"time"
)

// idleTouchDue claims alice's phone at 1000, beats it in the background
// until its activity turned idle, and returns that time with the idle
// touch handed out (in flight).
func idleTouchDue(t *testing.T, tb *Table) int64 {
	t.Helper()
	claim(t, tb, 1000, "alice", "phone")
	now := int64(1000)
	for ; now < 1000+idle; now += 15_000 {
		tb.Beat(now, "alice", "phone", false, false)
		due(tb, now)
	}
	now = 1000 + idle
	tb.Beat(now, "alice", "phone", false, false)
	w := due(tb, now)
	if len(w) != 1 || len(w[0].Touch) != 1 || w[0].Touch[0].Active {
		t.Fatalf("work when the activity turned idle: %+v, want the idle touch", w)
	}
	return now
}

// idleClaimed is idleTouchDue with the touch done: the store holds the
// phone idle.
func idleClaimed(t *testing.T, tb *Table) int64 {
	t.Helper()
	now := idleTouchDue(t, tb)
	tb.Done(now, "alice", Result{})
	return now
}

// activeTouches returns how many touches saying "active" Due hands out
// (and reports done) between from and to, with inactive beats every 15 s.
func activeTouches(tb *Table, from, to int64) int {
	n := 0
	for now := from; now <= to; now += 100 {
		if (now-from)%15_000 == 0 {
			tb.Beat(now, "alice", "phone", false, false)
		}
		for _, w := range due(tb, now) {
			for _, d := range w.Touch {
				if d.Active {
					n++
				}
			}
			tb.Done(now, w.User, Result{})
		}
	}
	return n
}

// An active beat of a device the store holds idle needs a touch; if that
// touch fails (the store hiccups) nothing sends it again: Due has no
// case for "claimed, held idle, active again", so the user reads away
// although active, until another active beat.
func TestFailedActiveTouchIsRetried(t *testing.T) {
	tb := newTable()
	now := idleClaimed(t, tb) + 1000
	if need := tb.Beat(now, "alice", "phone", true, false); need != NeedTouch {
		t.Fatalf("active beat of an idle device: need %d, want a touch", need)
	}
	tb.Done(now, "alice", Result{Failed: true})
	if n := activeTouches(tb, now+100, now+60_000); n == 0 {
		t.Fatalf("the failed active touch was never sent again within 60 s (retry 1 s)")
	}
}

// An active beat that lands while the idle touch is in flight is lost:
// Beat sees activeR still true (no again), Done then records the store
// holds the device idle, and nothing sends the active touch.
func TestActiveBeatDuringIdleTouch(t *testing.T) {
	tb := newTable()
	now := idleTouchDue(t, tb)
	// The user comes back while the idle touch is in flight.
	if need := tb.Beat(now+5, "alice", "phone", true, false); need != NeedNothing {
		t.Fatalf("beat while busy: need %d", need)
	}
	tb.Done(now+10, "alice", Result{})
	if n := activeTouches(tb, now+100, now+60_000); n == 0 {
		t.Fatalf("the active beat during the idle touch never reached the store within 60 s")
	}
}

// A device whose close grace ran out is being released when it beats
// again here (its client reconnected to this node): the beat does not
// revive it (in flight), the release's Done drops it, and the device —
// whose socket is open and just beat — is neither held nor claimed until
// its next beat.
func TestBeatDuringReleaseIsNotLost(t *testing.T) {
	tb := newTable()
	claim(t, tb, 1000, "alice", "phone")
	tb.Close(2000, "alice", "phone", 1000)
	now := 2000 + grace
	w := due(tb, now)
	if len(w) != 1 || len(w[0].Release) != 1 {
		t.Fatalf("work at the end of the grace: %+v, want a release", w)
	}
	// The reconnect's beat, while the release is in flight.
	tb.Beat(now+1, "alice", "phone", true, false)
	tb.Done(now+2, "alice", Result{})
	claims := 0
	for at := now + 100; at <= now+5_000; at += 100 {
		for _, w := range due(tb, at) {
			claims += len(w.Claim)
			tb.Done(at, w.User, Result{})
		}
	}
	if claims == 0 && len(tb.Devices(now+5_000, "alice", nil)) == 0 {
		t.Fatalf("the device beat at %d over a new socket, yet after its release the table neither holds nor claims it", now+1)
	}
}

// An idle touch that fails leaves the device held active in the store
// (activeR) with its activity idle, and u.retryAt in the future:
// workLocked does nothing before retryAt, and armLocked re-arms the user
// at max(now, LastActive+idle) = now, so Due pops it again at once —
// for ever, holding the shard lock. (In the tracker: a Redis blip that
// fails one batch of idle touches, and a probe that finds Redis back
// within Retry: the Run goroutine spins in Due, no sweep, no lease
// renewal, and every SocketBeat of that shard blocks.)
func TestFailedIdleTouchDoesNotSpinDue(t *testing.T) {
	tb := newTable()
	now := idleTouchDue(t, tb)
	tb.Done(now, "alice", Result{Failed: true})
	done := make(chan []Work, 1)
	go func() { done <- due(tb, now+100) }() // within Retry (1 s)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("Due after a failed idle touch did not return within 5 s (spins on the shard lock)")
	}
}
