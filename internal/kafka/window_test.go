package kafka

import (
	"math/rand/v2"
	"slices"
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

// render writes a window's actions as "+a" (beat of device a, active),
// "~a" (beat, not active), "-a" (disconnect).
func render(w *window) []string {
	var out []string
	for _, a := range w.actions() {
		switch {
		case a.bye:
			out = append(out, "-"+a.op.device)
		case a.op.active:
			out = append(out, "+"+a.op.device)
		default:
			out = append(out, "~"+a.op.device)
		}
	}
	return out
}

func TestWindowFold(t *testing.T) {
	const ttl = time.Minute
	now := ms(10_000)
	for _, c := range []struct {
		name     string
		replay   bool
		earlier  []ingest.Event // folded into an earlier window (applied)
		events   []ingest.Event
		outcomes []outcome
		actions  []string
	}{
		{
			name:     "beats of a device are one beat, active if one was",
			events:   []ingest.Event{beat("a", 1, true), beat("a", 3, false), beat("a", 2, false)},
			outcomes: []outcome{folded, coalesced, coalesced},
			actions:  []string{"+a"},
		},
		{
			name:     "inactive beats stay inactive",
			events:   []ingest.Event{beat("a", 1, false), beat("a", 2, false)},
			outcomes: []outcome{folded, coalesced},
			actions:  []string{"~a"},
		},
		{
			name:     "a device that came and went is shown coming and going",
			events:   []ingest.Event{beat("a", 1, false), beat("a", 2, true), bye("a", 3)},
			outcomes: []outcome{folded, coalesced, coalesced},
			actions:  []string{"+a", "-a"},
		},
		{
			name:     "read again, a device that came and went is only a disconnect",
			replay:   true,
			events:   []ingest.Event{beat("a", 1, true), beat("a", 2, true), bye("a", 3)},
			outcomes: []outcome{folded, coalesced, coalesced},
			actions:  []string{"-a"},
		},
		{
			name:     "a reconnect within the window is alive throughout, active as the beats after the disconnect",
			events:   []ingest.Event{beat("a", 1, true), bye("a", 2), beat("a", 3, false)},
			outcomes: []outcome{folded, coalesced, coalesced},
			actions:  []string{"~a"},
		},
		{
			name:     "a disconnect and a reconnect is a beat",
			events:   []ingest.Event{bye("a", 2), beat("a", 3, true)},
			outcomes: []outcome{folded, coalesced},
			actions:  []string{"+a"},
		},
		{
			name:     "a connect older than the disconnect before it is ignored",
			events:   []ingest.Event{bye("a", 5), beat("a", 4, true), beat("a", 5, true)},
			outcomes: []outcome{folded, ignored, ignored},
			actions:  []string{"-a"},
		},
		{
			name:     "a beat older than the ttl is stale, a disconnect never",
			events:   []ingest.Event{{User: "u", Device: "a", At: now.Add(-ttl - time.Millisecond)}, {Bye: true, User: "u", Device: "b", At: now.Add(-time.Hour)}},
			outcomes: []outcome{stale, folded},
			actions:  []string{"-b"},
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
			name:     "devices come and go in the order of their events",
			events:   []ingest.Event{beat("a", 1, true), beat("b", 2, true), bye("a", 3)},
			outcomes: []outcome{folded, folded, coalesced},
			actions:  []string{"+a", "+b", "-a"},
		},
		{
			name:     "a move to another device, then away",
			events:   []ingest.Event{beat("b", 1, true), bye("a", 2), beat("b", 3, true), bye("b", 4)},
			outcomes: []outcome{folded, folded, coalesced, coalesced},
			actions:  []string{"+b", "-a", "-b"},
		},
		{
			name:     "read again, a move to another device, then away",
			replay:   true,
			events:   []ingest.Event{beat("b", 1, true), bye("a", 2), beat("b", 3, true), bye("b", 4)},
			outcomes: []outcome{folded, folded, coalesced, coalesced},
			actions:  []string{"-a", "-b"},
		},
		{
			name:     "read again, the devices that stay alive beat first",
			replay:   true,
			events:   []ingest.Event{beat("c", 1, true), bye("b", 2), beat("a", 3, true), bye("c", 4)},
			outcomes: []outcome{folded, folded, folded, coalesced},
			actions:  []string{"+a", "-b", "-c"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			mem := ingest.NewMemory(time.Hour, 100)
			var seq uint64
			if len(c.earlier) > 0 {
				w := newWindow(0, now, false)
				for _, ev := range c.earlier {
					seq++
					w.fold(ev, seq, now, ttl, mem)
				}
			}
			w := newWindow(100, now, c.replay)
			for i, ev := range c.events {
				seq++
				if got := w.fold(ev, seq, now, ttl, mem); got != c.outcomes[i] {
					t.Errorf("event %d %+v: outcome %d, want %d", i, ev, got, c.outcomes[i])
				}
			}
			if got := render(w); !slices.Equal(got, c.actions) {
				t.Errorf("actions %q, want %q", got, c.actions)
			}
		})
	}
}

func TestWindowPrune(t *testing.T) {
	mem := ingest.NewMemory(time.Hour, 100)
	w := newWindow(0, t0, false)
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
	if got := render(w); !slices.Equal(got, []string{"+b", "-a", "-b"}) {
		t.Errorf("actions %q", got)
	}
}

// randomEvents returns 1 to 12 events of one user's devices a, b and c.
func randomEvents(rng *rand.Rand) []ingest.Event {
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
	return events
}

// model is a user's devices as the tracker holds them: alive or not. It
// counts the times the user's status changed (online iff a device lives).
type model struct {
	alive   map[string]bool
	changes int
}

func newModel(alive map[string]bool) *model {
	m := &model{alive: map[string]bool{}}
	for d, a := range alive {
		m.alive[d] = a
	}
	return m
}

func (m *model) online() bool {
	for _, a := range m.alive {
		if a {
			return true
		}
	}
	return false
}

func (m *model) set(device string, alive bool) {
	before := m.online()
	m.alive[device] = alive
	if m.online() != before {
		m.changes++
	}
}

func (m *model) apply(as []action) {
	for _, a := range as {
		m.set(a.op.device, !a.bye)
	}
}

func foldAll(events []ingest.Event, replay bool) *window {
	now := ms(10_000)
	mem := ingest.NewMemory(time.Hour, 100)
	w := newWindow(0, now, replay)
	for i, ev := range events {
		w.fold(ev, uint64(i+1), now, time.Minute, mem)
	}
	return w
}

// TestWindowMatchesOneByOne checks, on random event sequences, that every
// device ends as applying the same events one by one (by the rules of
// ingest.Memory, as the JetStream ingest does) leaves it, in a window
// and in a replay.
func TestWindowMatchesOneByOne(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 4000 {
		events := randomEvents(rng)
		now := ms(10_000)
		mem := ingest.NewMemory(time.Hour, 100)
		one := newModel(nil)
		for _, ev := range events {
			if ev.Bye {
				if mem.ByeAllowed(ev.User, ev.Device, ev.At, now) {
					mem.RecordBye(ev.User, ev.Device, ev.At, now)
					one.set(ev.Device, false)
				}
			} else if mem.BeatAllowed(ev.User, ev.Device, ev.At, now) {
				one.set(ev.Device, true)
			}
		}
		w := foldAll(events, round%2 == 1)
		win := newModel(nil)
		win.apply(w.actions())
		for _, d := range []string{"a", "b", "c"} {
			if one.alive[d] != win.alive[d] {
				t.Fatalf("round %d (replay %v): events %v: device %s alive %v one by one, %v by the window %q",
					round, w.replay, events, d, one.alive[d], win.alive[d], render(w))
			}
		}
	}
}

// TestReplayShowsNothingTwice checks, on random event sequences and
// devices alive before, that a node that applied any part of a window and
// died, followed by another node applying the same records as a replay,
// leaves every device as the window alone would and shows the user's
// status change no more often than the window alone.
func TestReplayShowsNothingTwice(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 4000 {
		events := randomEvents(rng)
		before := map[string]bool{"a": rng.IntN(2) == 0, "b": rng.IntN(2) == 0, "c": rng.IntN(2) == 0}
		live := foldAll(events, false).actions()
		whole := newModel(before)
		whole.apply(live)
		for k := 0; k <= len(live); k++ {
			m := newModel(before)
			m.apply(live[:k]) // the node that died
			m.apply(foldAll(events, true).actions())
			for _, d := range []string{"a", "b", "c"} {
				if m.alive[d] != whole.alive[d] {
					t.Fatalf("round %d: before %v, events %v, died after %d of %d actions: device %s alive %v, want %v",
						round, before, events, k, len(live), d, m.alive[d], whole.alive[d])
				}
			}
			if m.changes > whole.changes {
				t.Fatalf("round %d: before %v, events %v, died after %d of %d actions: %d status changes, the window alone makes %d",
					round, before, events, k, len(live), m.changes, whole.changes)
			}
		}
	}
}
