package gateway_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/presenced/presenced/internal/gateway"
	"github.com/presenced/presenced/internal/privacy"
	"github.com/presenced/presenced/internal/testwait"
)

// heldReader is the node's reader whose reads wait until released, and
// that counts those in flight.
type heldReader struct {
	gateway.Reader
	release        chan struct{}
	inFlight, peak atomic.Int64
	once           sync.Once
}

func (r *heldReader) Read(ctx context.Context, viewer string, ids []string, out []privacy.View) error {
	n := r.inFlight.Add(1)
	defer r.inFlight.Add(-1)
	for {
		p := r.peak.Load()
		if n <= p || r.peak.CompareAndSwap(p, n) {
			break
		}
	}
	<-r.release
	return r.Reader.Read(ctx, viewer, ids, out)
}

func (r *heldReader) open() { r.once.Do(func() { close(r.release) }) }

// Subscribes are resolved a few at a time (Config.MaxSubscribing): when
// many sockets subscribe at once — a reconnect storm — the others wait
// for their turn, and each is answered its snapshot in the end.
func TestSubscribesResolvedAFewAtATime(t *testing.T) {
	const most, clients = 3, 10
	var hr *heldReader
	n := newNode(t, opts{tweak: func(c *gateway.Config) {
		hr = &heldReader{Reader: c.Reader, release: make(chan struct{})}
		c.Reader = hr
		c.MaxSubscribing = most
	}})
	defer hr.open()
	cs := make([]*client, clients)
	for i := range cs {
		cs[i] = n.dial("w"+strconv.Itoa(i), "d")
		cs[i].msgType("welcome")
		cs[i].send(`{"type":"subscribe","user_ids":["t1","t2"]}`)
	}
	testwait.Forf(t, func() string {
		return fmt.Sprintf("%d snapshot reads in flight, want %d (the most at once)", hr.inFlight.Load(), most)
	}, func() bool { return hr.inFlight.Load() == most })
	hr.open()
	for i, c := range cs {
		if m := c.msgType("snapshot"); m["users"] == nil {
			t.Errorf("client %d: snapshot without users: %v", i, m)
		}
	}
	if p := hr.peak.Load(); p > most {
		t.Errorf("%d subscribes at once: %d resolved at the peak, want at most %d", clients, p, most)
	}
}
