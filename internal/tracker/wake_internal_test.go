package tracker

import (
	"testing"
	"time"
)

// Close deadlines come out in order, rounded up to the quantum, one entry
// per quantum; the earliest kicks Run; a full ring takes no more.
func TestCloseTimer(t *testing.T) {
	c := newCloseTimer(5 * time.Second) // quantum 4 ms
	if c.quantum != 4 {
		t.Fatalf("quantum %d ms, want 4", c.quantum)
	}
	c.add(1001)
	<-c.kick
	c.add(1003) // the same quantum: one entry
	c.add(1010)
	c.add(1005) // out of order, put in place
	select {
	case <-c.kick:
		t.Fatal("a deadline that is not the earliest kicked Run")
	default:
	}
	var got []int64
	for now := int64(0); ; {
		at := c.next(now)
		if at == 0 {
			break
		}
		got, now = append(got, at), at
	}
	if want := []int64{1004, 1008, 1012}; len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("deadlines %v, want %v", got, want)
	}
	for i := range closeRing + 10 {
		c.add(int64(10_000 + 4*i))
	}
	if c.n != closeRing {
		t.Errorf("%d deadlines held, want the bound %d", c.n, closeRing)
	}
	if at := c.next(10_000); at != 10_004 || c.n != closeRing-1 {
		t.Errorf("after dropping the first: next %d, %d held", at, c.n)
	}
}
