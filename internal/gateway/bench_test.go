package gateway_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/presenced/presenced/internal/presence"
)

// BenchmarkFanout500 measures how long one change of visible presence
// (a device going and coming back) takes to reach the sockets of 500
// watchers and be read there (clients in process).
func BenchmarkFanout500(b *testing.B) {
	ctx := context.Background()
	benchFanout500(b, func(n *node, i int) error {
		var err error
		if i%2 == 0 {
			_, err = n.tr.Bye(ctx, "star", "d")
		} else {
			_, err = n.tr.Heartbeat(ctx, "star", "d", true)
		}
		return err
	})
}

// BenchmarkStatus500 is BenchmarkFanout500 with a set_status (busy ↔
// online), the change that is a durable write (SQLite, synchronous=FULL):
// the time until all 500 watchers read it includes what the status write
// makes the change wait for, and ends no earlier than the write is durable.
func BenchmarkStatus500(b *testing.B) {
	ctx := context.Background()
	benchFanout500(b, func(n *node, i int) error {
		m := presence.ManualBusy
		if i%2 == 1 {
			m = presence.ManualNone
		}
		_, err := n.tr.SetStatus(ctx, "star", m, "")
		return err
	})
}

func benchFanout500(b *testing.B, change func(n *node, i int) error) {
	const watchers = 500
	n := newNode(b, opts{})
	ctx := context.Background()
	if _, err := n.tr.Heartbeat(ctx, "star", "d", true); err != nil {
		b.Fatal(err)
	}
	var got sync.WaitGroup
	cs := make([]*client, watchers)
	for i := range cs {
		cs[i] = n.dial("w"+strconv.Itoa(i), "")
		cs[i].msgType("welcome")
		cs[i].watch("star")
	}
	round := make(chan struct{})
	for _, c := range cs {
		go func() {
			for range round {
				for {
					f, err := c.frame(30 * time.Second)
					if err != nil || f.Header.OpCode == ws.OpClose {
						got.Done()
						return
					}
					if f.Header.OpCode == ws.OpText {
						break
					}
				}
				got.Done()
			}
		}()
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		got.Add(watchers)
		for range watchers {
			round <- struct{}{}
		}
		if err := change(n, i); err != nil {
			b.Fatal(err)
		}
		got.Wait()
	}
	b.StopTimer()
	close(round)
}
