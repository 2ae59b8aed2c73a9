// Package admission lets the work of setting sessions up yield to the
// sessions already up.
//
// A node killed under load sends its thousands of clients to the others
// at once: each reconnects, is authenticated, claims its device and
// subscribes again, a millisecond or two of CPU apiece. Admitted all at
// once they fill the run queues of the process and of the machine, and
// every established user's status write and every change's fan-out waits
// behind them for hundreds of milliseconds. A Gate admits that setup
// work a few at a time instead, and how many it admits follows how late
// the process wakes: a probe sleeps Tick and measures by how much it
// woke later than that. A wake-up more than Late behind means runnable
// work waits for a CPU — in this process or anywhere on the machine —
// and the limit halves; every four wake-ups on time it grows by one, up
// to Max (additive increase, multiplicative decrease, as TCP does with
// its window). The reconnecting clients wait at the gate, queued in
// order, holding only their connection; the sessions already up never
// do.
//
// The probe runs only while the gate has work (admitted or waiting) and
// for Idle after; an idle gate wakes nothing, and starts again at Start.
package admission

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Config shapes a Gate; zero fields take the defaults.
type Config struct {
	// Max is the most admitted at once (default 64).
	Max int
	// Start is the limit after an idle spell (default 4, at most Max).
	Start int
	// Tick is the probe's sleep (default 5 ms).
	Tick time.Duration
	// Late is how much later than Tick a wake-up may come before the
	// limit halves (default 2 ms).
	Late time.Duration
	// Idle is how long the probe goes on once the gate has no work
	// (default 1 s).
	Idle time.Duration
	// MaxWait is the longest an Enter waits (default 10 s): then ErrBusy.
	MaxWait time.Duration
}

// ErrBusy is Enter's answer after Config.MaxWait.
var ErrBusy = errors.New("admission: the node is busy setting other sessions up")

// Stats are a gate's counts.
type Stats struct {
	Limit    int    // admitted at once, now
	InFlight int    // admitted, not yet left
	Waiting  int    // waiting to be admitted
	Admitted uint64 // Enters that returned nil
	Busy     uint64 // Enters that returned ErrBusy
	Late     uint64 // probe wake-ups later than Late (each halved the limit)
}

// Gate admits setup work at a rate that follows the process's wake-ups.
// Its methods are safe for concurrent use.
type Gate struct {
	cfg  Config
	wake chan struct{} // work arrived: the probe starts (one slot)

	mu       sync.Mutex
	limit    int
	inFlight int
	waiters  []chan struct{} // in arrival order; closed when admitted
	good     int             // wake-ups on time since the limit last moved
	admitted uint64
	busy     uint64
	late     uint64
}

// New returns a gate at cfg.Start.
func New(cfg Config) *Gate {
	if cfg.Max <= 0 {
		cfg.Max = 64
	}
	if cfg.Start <= 0 {
		cfg.Start = 4
	}
	cfg.Start = min(cfg.Start, cfg.Max)
	if cfg.Tick <= 0 {
		cfg.Tick = 5 * time.Millisecond
	}
	if cfg.Late <= 0 {
		cfg.Late = 2 * time.Millisecond
	}
	if cfg.Idle <= 0 {
		cfg.Idle = time.Second
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 10 * time.Second
	}
	return &Gate{cfg: cfg, wake: make(chan struct{}, 1), limit: cfg.Start}
}

// Enter waits for the gate to admit the caller, in arrival order; the
// caller calls Leave once its setup is done. It returns ctx's error when
// ctx ends first and ErrBusy after Config.MaxWait, admitting nothing.
func (g *Gate) Enter(ctx context.Context) error {
	g.poke()
	g.mu.Lock()
	if len(g.waiters) == 0 && g.inFlight < g.limit {
		g.inFlight++
		g.admitted++
		g.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	g.waiters = append(g.waiters, ch)
	g.mu.Unlock()
	t := time.NewTimer(g.cfg.MaxWait)
	defer t.Stop()
	var err error
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-t.C:
		err = ErrBusy
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, w := range g.waiters {
		if w == ch {
			g.waiters = append(g.waiters[:i], g.waiters[i+1:]...)
			if err == ErrBusy {
				g.busy++
			}
			return err
		}
	}
	// Admitted as it gave up: the place goes to the next.
	g.admitted--
	g.inFlight--
	g.admitLocked()
	if err == ErrBusy {
		g.busy++
	}
	return err
}

// Leave ends an admission.
func (g *Gate) Leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inFlight <= 0 {
		panic("admission: Leave without Enter")
	}
	g.inFlight--
	g.admitLocked()
}

// admitLocked admits waiters, oldest first, while the limit allows.
func (g *Gate) admitLocked() {
	for len(g.waiters) > 0 && g.inFlight < g.limit {
		close(g.waiters[0])
		g.waiters[0] = nil
		g.waiters = g.waiters[1:]
		g.inFlight++
		g.admitted++
	}
	if len(g.waiters) == 0 {
		g.waiters = nil // let the backing array go after a storm
	}
}

// observe moves the limit by one probe wake-up that came lateBy after
// its time.
func (g *Gate) observe(lateBy time.Duration) {
	if lateBy > g.cfg.Late {
		g.late++
		g.limit = max(1, g.limit/2)
		g.good = 0
		return
	}
	g.good++
	if g.good >= 4 {
		g.good = 0
		if g.limit < g.cfg.Max {
			g.limit++
			g.admitLocked()
		}
	}
}

// poke starts the probe if it is not running.
func (g *Gate) poke() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// Run probes the process's wake-ups while the gate has work, until ctx
// ends. Without Run the limit stays at Config.Start.
func (g *Gate) Run(ctx context.Context) error {
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-g.wake:
		}
		var quiet time.Duration // since the gate last had work
		for quiet < g.cfg.Idle {
			start := time.Now()
			t.Reset(g.cfg.Tick)
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
			g.mu.Lock()
			g.observe(time.Since(start) - g.cfg.Tick)
			if g.inFlight > 0 || len(g.waiters) > 0 {
				quiet = 0
			} else {
				quiet += g.cfg.Tick
			}
			g.mu.Unlock()
		}
		g.mu.Lock()
		g.limit, g.good = g.cfg.Start, 0
		g.mu.Unlock()
	}
}

// Stats returns the gate's counts.
func (g *Gate) Stats() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return Stats{Limit: g.limit, InFlight: g.inFlight, Waiting: len(g.waiters), Admitted: g.admitted, Busy: g.busy, Late: g.late}
}
