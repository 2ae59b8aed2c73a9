package gateway_test

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// An open socket keeps nothing of its upgrade request: the ids it keeps
// (its device id from the query, here) are copies, not pieces of the
// request line, which can be long (a token in the query). 200 sockets
// whose request lines carry 4 KiB more must not hold ~800 KiB more heap.
func TestSocketsKeepNoRequestBytes(t *testing.T) {
	heapWith := func(pad int) uint64 {
		n := newNode(t, opts{})
		q := ""
		if pad > 0 {
			q = "&pad=" + strings.Repeat("p", pad)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		clients := make([]*client, 200)
		for i := range clients {
			clients[i] = n.dialQuery("?token="+n.token(fmt.Sprint("u", i), "")+"&device_id="+fmt.Sprint("d", i)+q, nil)
			clients[i].msgType("welcome")
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(clients)
		n.close()
		return after.HeapAlloc - before.HeapAlloc
	}
	heapWith(0) // what the first node costs once (the database, the pools)
	plain := heapWith(0)
	padded := heapWith(4096)
	if padded > plain+200*1024 {
		t.Errorf("200 sockets with 4 KiB longer request lines hold %d KiB more heap (%d → %d KiB): their request lines are kept",
			(padded-plain)/1024, plain/1024, padded/1024)
	}
}
