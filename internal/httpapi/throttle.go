package httpapi

import (
	"hash/maphash"
	"sync"
)

// throttle allows one read per interval per user. It is safe for
// concurrent use; its memory is bounded by the users who read within the
// last interval (older entries are pruned as shards grow).
type throttle struct {
	interval int64 // ms
	seed     maphash.Seed
	shards   [64]throttleShard
}

type throttleShard struct {
	mu    sync.Mutex       // guards next
	next  map[string]int64 // user → earliest next read (Unix ms)
	limit int              // prune when next grows past this
}

func newThrottle(intervalMS int64) *throttle {
	t := &throttle{interval: intervalMS, seed: maphash.MakeSeed()}
	for i := range t.shards {
		t.shards[i].next = make(map[string]int64)
		t.shards[i].limit = 1024
	}
	return t
}

// allow reports whether user may read at now; if not, how many ms to wait.
func (t *throttle) allow(user string, now int64) (bool, int64) {
	if t.interval <= 0 {
		return true, 0
	}
	sh := &t.shards[maphash.String(t.seed, user)%uint64(len(t.shards))]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if next, ok := sh.next[user]; ok && now < next {
		return false, next - now
	}
	if len(sh.next) >= sh.limit {
		for u, next := range sh.next {
			if next <= now {
				delete(sh.next, u)
			}
		}
		sh.limit = max(1024, 2*len(sh.next))
	}
	sh.next[user] = now + t.interval
	return true, 0
}
