package beacon_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/beacon"
	"github.com/presenced/presenced/internal/jsstream"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

func conn(t *testing.T, url string) *jsstream.Conn {
	t.Helper()
	c, err := jsstream.Dial(url, "beacon-test", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// Two nodes hear each other; a node that stops publishing is no longer
// alive after Timeout; a node that cannot hear (its NATS is down) calls
// everyone alive for Blind, then nobody.
func TestNodesHearEachOther(t *testing.T) {
	srv := testsvc.NATS(t)
	var leaseA, leaseB atomic.Uint64
	leaseA.Store(7)
	leaseB.Store(8)
	newBeacon := func() *beacon.Beacon {
		b, err := beacon.New(beacon.Config{Conn: conn(t, srv.URL), Subject: "t.nodes",
			Interval: 50 * time.Millisecond, Timeout: 300 * time.Millisecond, Blind: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a, b := newBeacon(), newBeacon()
	made := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctxA, stopA := context.WithCancel(ctx)
	go a.Run(ctxA, leaseA.Load)
	go b.Run(ctx, leaseB.Load)
	testwait.For(t, "b hears a", func() bool { return b.Alive(7) })
	testwait.For(t, "a hears b", func() bool { return a.Alive(8) })
	if b.Alive(9) {
		// Right after start a node cannot tell yet; past Timeout it can.
		time.Sleep(time.Until(made.Add(300 * time.Millisecond))) // the scenario: Timeout passes
		if b.Alive(9) {
			t.Error("a lease nobody publishes is alive")
		}
	}
	stopA()
	testwait.For(t, "b finds a silent", func() bool { return !b.Alive(7) })
	// NATS goes away: b cannot hear, and calls a lease alive for Blind.
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "b deaf", func() bool { return b.Alive(42) })
	testwait.For(t, "b judges by the store alone after Blind", func() bool { return !b.Alive(42) })
}

// A node's beacon carries its name: the others list it under its lease
// with that name, and when they last heard it.
func TestNodesNamed(t *testing.T) {
	srv := testsvc.NATS(t)
	newBeacon := func(name string) *beacon.Beacon {
		b, err := beacon.New(beacon.Config{Conn: conn(t, srv.URL), Subject: "t.named",
			Interval: 50 * time.Millisecond, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a, b := newBeacon("node-a"), newBeacon("node-b")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Run(ctx, func() uint64 { return 7 })
	go b.Run(ctx, func() uint64 { return 8 })
	names := func(bc *beacon.Beacon) map[uint64]string {
		m := map[uint64]string{}
		for _, n := range bc.Nodes() {
			if n.Heard.IsZero() {
				t.Errorf("lease %d listed with no time heard", n.Lease)
			}
			m[n.Lease] = n.Name
		}
		return m
	}
	testwait.For(t, "a hears both, named", func() bool { m := names(a); return m[7] == "node-a" && m[8] == "node-b" })
	testwait.For(t, "b hears both, named", func() bool { m := names(b); return m[7] == "node-a" && m[8] == "node-b" })
	if got, want := a.Timeout(), 150*time.Millisecond; got != want {
		t.Errorf("Timeout() = %s, want 3 intervals = %s", got, want)
	}
}
