package kafka

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/ingest"
)

var t0 = time.Date(2026, 11, 23, 1, 0, 0, 0, time.UTC)

func ms(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }

func beat(dev string, at int, active bool) ingest.Event {
	return ingest.Event{User: "u", Device: dev, At: ms(at), Active: active}
}

func bye(dev string, at int) ingest.Event {
	return ingest.Event{Bye: true, User: "u", Device: dev, At: ms(at)}
}

func TestWindowFold(t *testing.T) {
	const ttl = time.Minute
	now := ms(10_000)
	type want struct {
		dev    string
		bye    bool
		active bool
		at     int
	}
	for _, c := range []struct {
		name     string
		earlier  []ingest.Event // folded into an earlier window (applied)
		events   []ingest.Event
		outcomes []outcome
		ops      []want // in seq order
	}{
		{
			name:     "beats of a device are one beat, active if one was",
			events:   []ingest.Event{beat("a", 1, true), beat("a", 3, false), beat("a", 2, false)},
			outcomes: []outcome{folded, coalesced, coalesced},
			ops:      []want{{dev: "a", active: true, at: 3}},
		},
		{
			name:     "inactive beats stay inactive",
			events:   []ingest.Event{beat("a", 1, false), beat("a", 2, false)},
			outcomes: []outcome{folded, coalesced},
			ops:      []want{{dev: "a", at: 2}},
		},
		{
			name:     "a device that came and went is only a disconnect",
			events:   []ingest.Event{beat("a", 1, true), beat("a", 2, true), bye("a", 3)},
			outcomes: []outcome{folded, coalesced, coalesced},
			ops:      []want{{dev: "a", bye: true, at: 3}},
		},
		{
			name:     "a reconnect within the window is only a beat, active as the beats after the disconnect",
			events:   []ingest.Event{beat("a", 1, true), bye("a", 2), beat("a", 3, false)},
			outcomes: []outcome{folded, coalesced, coalesced},
			ops:      []want{{dev: "a", at: 3}},
		},
		{
			name:     "a connect older than the disconnect before it is ignored",
			events:   []ingest.Event{bye("a", 5), beat("a", 4, true), beat("a", 5, true)},
			outcomes: []outcome{folded, ignored, ignored},
			ops:      []want{{dev: "a", bye: true, at: 5}},
		},
		{
			name:     "a beat older than the ttl is stale, a disconnect never",
			events:   []ingest.Event{{User: "u", Device: "a", At: now.Add(-ttl - time.Millisecond)}, {Bye: true, User: "u", Device: "b", At: now.Add(-time.Hour)}},
			outcomes: []outcome{stale, folded},
			ops:      []want{{dev: "b", bye: true, at: int(now.Add(-time.Hour).Sub(t0) / time.Millisecond)}},
		},
		{
			name:     "a connect redelivered after an applied disconnect is ignored",
			earlier:  []ingest.Event{beat("a", 1, true), bye("a", 2)},
			events:   []ingest.Event{beat("a", 1, true)},
			outcomes: []outcome{ignored},
		},
		{
			name:     "an old disconnect redelivered after a reconnect is ignored",
			earlier:  []ingest.Event{bye("a", 2), beat("a", 3, true)},
			events:   []ingest.Event{bye("a", 2)},
			outcomes: []outcome{ignored},
		},
		{
			name:     "devices are apart, in the order of their last events",
			events:   []ingest.Event{beat("a", 1, true), beat("b", 2, true), bye("a", 3)},
			outcomes: []outcome{folded, folded, coalesced},
			ops:      []want{{dev: "b", active: true, at: 2}, {dev: "a", bye: true, at: 3}},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			mem := ingest.NewMemory(time.Hour, 100)
			var seq uint64
			if len(c.earlier) > 0 {
				w := newWindow(0, now)
				for _, ev := range c.earlier {
					seq++
					w.fold(ev, seq, now, ttl, mem)
				}
			}
			w := newWindow(100, now)
			for i, ev := range c.events {
				seq++
				if got := w.fold(ev, seq, now, ttl, mem); got != c.outcomes[i] {
					t.Errorf("event %d %+v: outcome %d, want %d", i, ev, got, c.outcomes[i])
				}
			}
			ops := w.undone()
			if len(ops) != len(c.ops) {
				t.Fatalf("%d ops, want %d: %+v", len(ops), len(c.ops), ops)
			}
			for i, o := range ops {
				got := want{dev: o.device, bye: o.bye, active: o.active, at: int(o.at.Sub(t0) / time.Millisecond)}
				if got != c.ops[i] {
					t.Errorf("op %d = %+v, want %+v", i, got, c.ops[i])
				}
			}
		})
	}
}

func TestWindowPrune(t *testing.T) {
	mem := ingest.NewMemory(time.Hour, 100)
	w := newWindow(0, t0)
	w.fold(beat("a", 1, true), 1, t0, time.Minute, mem)
	w.fold(beat("b", 1, true), 2, t0, time.Minute, mem)
	w.ops[0].done = true
	if n := w.prune(); n != 1 || w.ops[0].device != "b" {
		t.Fatalf("prune left %d ops (%+v), want b only", n, w.ops)
	}
	// A later event of a done device makes a new op; one of a device
	// not done yet folds into its op.
	if got := w.fold(bye("a", 2), 3, t0, time.Minute, mem); got != folded {
		t.Errorf("event of a done device: %d, want folded", got)
	}
	if got := w.fold(bye("b", 2), 4, t0, time.Minute, mem); got != coalesced {
		t.Errorf("event of a pending device: %d, want coalesced", got)
	}
	if n := len(w.undone()); n != 2 {
		t.Errorf("%d ops, want 2", n)
	}
}

// TestWindowMatchesOneByOne checks, on random event sequences, that a
// device ends alive after its window exactly when applying the same events
// one by one (by the same rules of ingest.Memory) leaves it alive, and that
// a device the window only ends is one the events one by one end too.
func TestWindowMatchesOneByOne(t *testing.T) {
	const ttl = time.Minute
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 2000 {
		devs := []string{"a", "b", "c"}
		var events []ingest.Event
		for range 1 + rng.IntN(12) {
			d := devs[rng.IntN(len(devs))]
			at := rng.IntN(20)
			if rng.IntN(3) == 0 {
				events = append(events, bye(d, at))
			} else {
				events = append(events, beat(d, at, rng.IntN(2) == 0))
			}
		}
		now := ms(10_000)
		// One by one: the JetStream ingest's rules.
		mem1 := ingest.NewMemory(time.Hour, 100)
		alive := map[string]bool{}
		touched := map[string]bool{}
		for _, ev := range events {
			if ev.Bye {
				if mem1.ByeAllowed(ev.User, ev.Device, ev.At, now) {
					mem1.RecordBye(ev.User, ev.Device, ev.At, now)
					alive[ev.Device], touched[ev.Device] = false, true
				}
			} else if mem1.BeatAllowed(ev.User, ev.Device, ev.At, now) {
				alive[ev.Device], touched[ev.Device] = true, true
			}
		}
		// As one window.
		mem2 := ingest.NewMemory(time.Hour, 100)
		w := newWindow(0, now)
		for i, ev := range events {
			w.fold(ev, uint64(i+1), now, ttl, mem2)
		}
		got := map[string]bool{}
		for _, o := range w.undone() {
			if _, dup := got[o.device]; dup {
				t.Fatalf("round %d: two ops for device %s", round, o.device)
			}
			got[o.device] = !o.bye
		}
		for _, d := range devs {
			if touched[d] != (func() bool { _, ok := got[d]; return ok })() || got[d] != alive[d] {
				t.Fatalf("round %d: events %s: device %s one by one: touched %v alive %v; window: %v",
					round, fmt.Sprint(events), d, touched[d], alive[d], got)
			}
		}
	}
}
