package gateway

import (
	"container/heap"
	"sync"
)

// idleIndex is the deadline index of silent connections and expiring
// tokens: a min-heap of (deadline, conn), one item per open connection,
// at the earlier of the connection's idle deadline and its token's
// expiry (conn.deadline). A message only moves the connection's idleAt
// forward (a token's expiry never moves); the heap item is corrected
// lazily when it comes due, so a message costs one atomic store and each
// connection is re-pushed at most once per ttl. A closed connection's item
// is removed at once (conn.heapIdx), so closed connections are not kept
// until their deadline.
type idleIndex struct {
	mu sync.Mutex // guards h
	h  idleHeap
}

type idleItem struct {
	at int64
	c  *conn
}

type idleHeap []idleItem

func (h idleHeap) Len() int           { return len(h) }
func (h idleHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h idleHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].c.heapIdx, h[j].c.heapIdx = int32(i), int32(j)
}
func (h *idleHeap) Push(x any) {
	it := x.(idleItem)
	it.c.heapIdx = int32(len(*h))
	*h = append(*h, it)
}
func (h *idleHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = idleItem{}
	*h = old[:len(old)-1]
	it.c.heapIdx = -1
	return it
}

func (x *idleIndex) push(at int64, c *conn) {
	x.mu.Lock()
	heap.Push(&x.h, idleItem{at: at, c: c})
	x.mu.Unlock()
}

// remove drops c's item, if it has one.
func (x *idleIndex) remove(c *conn) {
	x.mu.Lock()
	if i := int(c.heapIdx); i >= 0 && i < len(x.h) && x.h[i].c == c {
		heap.Remove(&x.h, i)
	}
	x.mu.Unlock()
}

// due pops the connections whose item is due at now into out: closed ones
// are dropped, ones that spoke since (and whose token has not expired) are
// pushed back at their new deadline.
func (x *idleIndex) due(now int64, out []*conn) []*conn {
	x.mu.Lock()
	defer x.mu.Unlock()
	for len(x.h) > 0 && x.h[0].at <= now {
		it := heap.Pop(&x.h).(idleItem)
		c := it.c
		c.mu.Lock()
		gone := c.closing
		c.mu.Unlock()
		if gone {
			continue
		}
		if at := c.deadline(); at > now {
			heap.Push(&x.h, idleItem{at: at, c: c})
			continue
		}
		out = append(out, c)
	}
	return out
}

// sweepIdle closes every connection whose token has expired, with 4003,
// and every connection silent for one ttl, with 4001. A connection whose
// socket holds unread bytes is not silent — the server is behind, not the
// client — and is given another ttl (but not past its token's expiry).
// A 4003 is not a bye: the device keeps its close grace for the client to
// come back with a fresh token.
func (g *Gateway) sweepIdle() {
	now := g.now()
	for _, c := range g.idle.due(now, nil) {
		if c.expired(now) {
			g.stats.closedExpired.Add(1)
			c.close(closeExpired, "token expired")
			continue
		}
		if unread(c) {
			c.idleAt.Store(now + g.ttlMs)
			g.idle.push(c.deadline(), c)
			continue
		}
		g.stats.closedIdle.Add(1)
		c.close(closeIdle, "idle")
	}
}
