package fanout_test

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/presenced/presenced/internal/fanout"
)

// BenchmarkSubscriptionMemory measures the hub's heap per subscription:
// 200 sinks watching 500 users each (the default cap), the heap after a
// collection before and after, over the subscriptions.
//
//	go test -run XXX -bench SubscriptionMemory -count 3 ./internal/fanout
func BenchmarkSubscriptionMemory(b *testing.B) {
	const sinks, per = 200, 500
	users := ids("u", 5000)
	for b.Loop() {
		h := newHub(b, newRels(), fanout.Config{})
		all := make([]*countSink, sinks)
		for i := range all {
			all[i] = &countSink{viewer: fmt.Sprint("v", i)}
		}
		before := heap()
		for i, s := range all {
			start := i * 37 % (len(users) - per)
			subscribe(b, h, s, users[start:start+per]...)
		}
		after := heap()
		b.ReportMetric(float64(after-before)/(sinks*per), "B/sub")
		runtime.KeepAlive(h)
	}
}

// heap is the heap in use after a collection.
func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
