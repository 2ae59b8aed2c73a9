package redisstore_test

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/benchfix"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tracker"
)

// populate loads n users and beats each once, many at a time.
func populate(b *testing.B, s *redisstore.Store, n int, now int64) []string {
	b.Helper()
	ctx := context.Background()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint("user-", i)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 64 {
		wg.Go(func() {
			for i := w; i < n; i += 64 {
				if err := s.Load(ctx, now, &presence.Profile{UserID: ids[i]}); err != nil {
					errs <- err
					return
				}
				if _, err := s.Beat(ctx, now, ids[i], "d", true); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return ids
}

// BenchmarkBeat: heartbeats (that change nothing, the common case) of
// 1,000 concurrent callers over 100,000 users. The beats that queue while
// a call of their group is in flight share the next script call (beat.go).
// Measured here (2 cores shared by Redis and the benchmark, Redis 7.0),
// interleaved A/B: one script call per beat, pipelined by rueidis,
// 56–80k beats/s; batched, 89–109k beats/s (docs/benchmarks.md).
func BenchmarkBeat(b *testing.B) {
	c := client(b)
	s := newStore(b, c, redisstore.Config{})
	const t0 = int64(1_700_000_000_000)
	ids := populate(b, s, 100_000, t0)
	ctx := context.Background()
	var next atomic.Uint64
	b.SetParallelism((1000 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ReportAllocs()
	cpu0 := redisCPU(b, c)
	calls0 := s.BeatCalls()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := next.Add(1)
			if _, err := s.Beat(ctx, t0+int64(i/100_000), ids[i%100_000], "d", true); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "beats/s")
	b.ReportMetric(float64(b.N)/float64(max(s.BeatCalls()-calls0, 1)), "beats/call")
	b.ReportMetric((redisCPU(b, c)-cpu0)*1e6/float64(b.N), "redis-µs/beat")
}

// redisCPU returns the CPU seconds the Redis server c talks to has used.
func redisCPU(b *testing.B, c rueidis.Client) float64 {
	b.Helper()
	cpu, err := benchfix.RedisCPU(context.Background(), c)
	if err != nil {
		b.Fatal(err)
	}
	return cpu
}

// BenchmarkGet1000: one read of 1,000 settled users (one pipelined round
// trip: an HMGET per bucket touched; docs/benchmarks.md has the figures).
func BenchmarkGet1000(b *testing.B) {
	c := client(b)
	s := newStore(b, c, redisstore.Config{})
	const t0 = int64(1_700_000_000_000)
	ids := populate(b, s, 1000, t0)
	out := make([]presence.Snapshot, len(ids))
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := s.Get(ctx, t0+1, ids, out); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if !out[999].Known || out[999].Status != presence.Online {
		b.Fatalf("Get: got %+v, want online", out[999])
	}
}

// usedMemory returns Redis's used_memory (INFO memory).
func usedMemory(b *testing.B, c rueidis.Client) int64 {
	b.Helper()
	info, err := c.Do(context.Background(), c.B().Info().Section("memory").Build()).ToString()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatal("INFO memory has no used_memory")
	return 0
}

// drainDirty drains the dirty sets of s's 256 shards as a node's
// checkpoints do, 16 shards a call: a million users' checkpoints in one
// call are one reply of ~60 MB, which a loaded machine may not answer
// within the client's timeout.
func drainDirty(b *testing.B, s *redisstore.Store) {
	b.Helper()
	for lo := 0; lo < 256; lo += 16 {
		if _, err := s.DirtyParts(context.Background(), func(p int) bool { return p < lo || p >= lo+16 }, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// loader returns a client of its own for a memory benchmark to load its
// users through, and a func that closes it and waits until Redis has
// freed its connections. The connections a store opens while it loads
// (its first claims on a shard ask for the replicas on connections of
// their own: up to 32, each with tens of KB of buffers — ~8 B a user at
// 200,000) count in used_memory, and are no part of what a user costs:
// the benchmark measures with c once they are gone.
func loader(b *testing.B, url string, c rueidis.Client) (rueidis.Client, func()) {
	b.Helper()
	lc, err := redisstore.Dial(url)
	if err != nil {
		b.Fatal(err)
	}
	clients := func() int {
		list, err := c.Do(context.Background(), c.B().ClientList().Build()).ToString()
		if err != nil {
			b.Fatal(err)
		}
		return strings.Count(list, "\n")
	}
	alone := clients()
	return lc, func() {
		lc.Close()
		for deadline := time.Now().Add(10 * time.Second); clients() > alone; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatalf("the loader's connections stay open: %d clients, want %d", clients(), alone)
			}
		}
	}
}

// BenchmarkMemoryPerUser: Redis memory per online user beating over HTTP
// (b.N users, on a private Redis, after the checkpoint drained the dirty
// sets, and the loading client gone: loader): what the HTTP heartbeat stores — the tracker loads the user, then
// its beat, read back for the answer (BeatRead), keeps one device that is
// no node's, due a ttl later — against the naive design's one key per
// user (SET user status EX ttl) on the same server, in the same run.
// Device ids as the gateway assigns them, and "d". Run with -benchtime
// 200000x and 1000000x: the figures are bytes per user, not time.
func BenchmarkMemoryPerUser(b *testing.B) {
	for _, tc := range []struct {
		name   string
		device func(i int) string
	}{
		{"device=server-assigned", gatewayDeviceID},
		{"device=d", func(int) string { return "d" }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			srv := testsvc.Redis(b)
			c := dial(b, srv.URL)
			lc, done := loader(b, srv.URL, c)
			s := newStore(b, lc, redisstore.Config{Prefix: "m:"})
			ctx := context.Background()
			base := usedMemory(b, c)
			now := time.Now().UnixMilli()
			var wg sync.WaitGroup
			for w := range 64 {
				wg.Go(func() {
					var snap presence.Snapshot
					for i := w; i < b.N; i += 64 {
						id := fmt.Sprint("user-", i)
						if err := s.Load(ctx, now, &presence.Profile{UserID: id}); err != nil {
							b.Error(err)
							return
						}
						if _, _, err := s.BeatRead(ctx, now, id, tc.device(i), true, &snap); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			if b.Failed() {
				b.FailNow()
			}
			drainDirty(b, s)
			done()
			ours := usedMemory(b, c) - base
			base = usedMemory(b, c)
			cmds := make(rueidis.Commands, 0, 1000)
			for i := 0; i < b.N; i += 1000 {
				cmds = cmds[:0]
				for j := i; j < min(i+1000, b.N); j++ {
					cmds = append(cmds, c.B().Set().Key(fmt.Sprint("naive:user-", j)).Value("online").Ex(30*time.Second).Build())
				}
				for _, r := range c.DoMulti(ctx, cmds...) {
					if err := r.Error(); err != nil {
						b.Fatal(err)
					}
				}
			}
			naive := usedMemory(b, c) - base
			b.ReportMetric(float64(ours)/float64(b.N), "B/user")
			b.ReportMetric(float64(naive)/float64(b.N), "naive-B/user")
		})
	}
}

// BenchmarkTransition: a visible change — a status toggled between busy
// and online — of 1,000 concurrent callers over 100,000 online users: one
// full script each (load the hash, settle, stamp a version, save), the
// cost every transition pays (connect of a first device, status, away,
// bye, death). Reported as Redis CPU per transition, for the sizing in
// docs/operations.md.
func BenchmarkTransition(b *testing.B) {
	c := client(b)
	s := newStore(b, c, redisstore.Config{})
	const t0 = int64(1_700_000_000_000)
	ids := populate(b, s, 100_000, t0)
	ctx := context.Background()
	var next, changed atomic.Uint64
	b.SetParallelism((1000 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ReportAllocs()
	cpu0 := redisCPU(b, c)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := next.Add(1)
			m := presence.ManualBusy
			if (i/100_000)%2 == 1 {
				m = presence.ManualNone
			}
			ch, err := s.SetStatus(ctx, t0+1+int64(i/100_000), ids[i%100_000], m, "")
			if err != nil {
				b.Error(err)
				return
			}
			if ch.Changed {
				changed.Add(1)
			}
		}
	})
	// Calls of one user from two rounds may cross (1,000 callers): the
	// later round's then finds nothing to change. Count only changes.
	n := float64(max(changed.Load(), 1))
	b.ReportMetric(n/time.Since(start).Seconds(), "transitions/s")
	b.ReportMetric((redisCPU(b, c)-cpu0)*1e6/n, "redis-µs/transition")
	b.ReportMetric(n/float64(b.N), "changed/op")
}

// BenchmarkDeviceNote: what a device note costs Redis. 100,000 users
// online with one device each; every operation brings a second device
// (a beat of it) or sends it away (its bye), so each script changes a
// present user's device count and nothing everyone sees: it sends one
// SPUBLISH to the shard's notes channel, which one subscriber (a node's
// Store.Notes) hears. Reported: Redis CPU per operation, the whole
// script; the SPUBLISH's own time as Redis counts it (INFO
// commandstats); notes sent and heard per operation.
func BenchmarkDeviceNote(b *testing.B) {
	c := client(b)
	s := newStore(b, c, redisstore.Config{})
	const users = 100_000
	const t0 = int64(1_700_000_000_000)
	ids := populate(b, s, users, t0)
	l, ctx := hear(b, s)
	var next atomic.Uint64
	b.SetParallelism((1000 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	cpu0 := redisCPU(b, c)
	pubs0, pubUsec0, err := benchfix.RedisCommands(ctx, c, "spublish")
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := next.Add(1) - 1
			id, now := ids[i%users], t0+1+int64(i/users)
			var err error
			if (i/users)%2 == 0 {
				_, err = s.Beat(ctx, now, id, "d2", true)
			} else {
				_, err = s.Bye(ctx, now, id, "d2")
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	cpu := redisCPU(b, c) - cpu0
	pubs, pubUsec, err := benchfix.RedisCommands(ctx, c, "spublish")
	if err != nil {
		b.Fatal(err)
	}
	n := float64(b.N)
	testwait.For(b, "every note heard", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return int64(len(l.notes)) >= pubs-pubs0
	})
	b.ReportMetric(cpu*1e6/n, "redis-µs/op")
	b.ReportMetric(float64(pubUsec-pubUsec0)/n, "spublish-µs/op")
	b.ReportMetric(float64(pubs-pubs0)/n, "notes/op")
	b.ReportMetric(float64(len(l.take()))/n, "heard/op")
}

// BenchmarkHTTPBeatsWithSweeps: what users beating over HTTP cost Redis
// with their deadlines kept: 100,000 users, each beating every 15 s (ttl
// 30 s) at its own phase, while one node sweeps every 100 ms — each
// iteration is 100 ms of simulated time, its beats (1,000 concurrent
// callers) and then a sweep. Reported as Redis CPU per beat, the sweeps'
// re-arming included; nobody may go offline. Run with -benchtime 600x
// (a minute: four beats a user).
func BenchmarkHTTPBeatsWithSweeps(b *testing.B) {
	srv := testsvc.Redis(b)
	c := dial(b, srv.URL)
	s := newStore(b, c, redisstore.Config{Prefix: "m:"})
	const users, period, step = 100_000, 15_000, 100
	const t0 = int64(1_700_000_000_000)
	ids := populate(b, s, users, t0)
	ctx := context.Background()
	var beats, offline atomic.Int64
	cpu0 := redisCPU(b, c)
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		now := t0 + int64(i)*step
		phase := i % (period / step)
		var next atomic.Int64
		next.Store(int64(phase))
		var wg sync.WaitGroup
		for range 1000 {
			wg.Go(func() {
				for {
					u := next.Add(period/step) - period/step
					if u >= users {
						return
					}
					if _, err := s.Beat(ctx, now, ids[u], "d", true); err != nil {
						b.Error(err)
						return
					}
					beats.Add(1)
				}
			})
		}
		wg.Wait()
		out, err := s.Expire(ctx, now, 100_000, nil)
		if err != nil {
			b.Fatal(err)
		}
		for _, ch := range out {
			if ch.Event.Status == presence.Offline {
				offline.Add(1)
			}
		}
	}
	b.StopTimer()
	if offline.Load() != 0 {
		b.Fatalf("%d users went offline while beating", offline.Load())
	}
	b.ReportMetric((redisCPU(b, c)-cpu0)*1e6/float64(max(beats.Load(), 1)), "redis-µs/beat")
	b.ReportMetric(float64(beats.Load())/float64(b.N), "beats/op")
}

// BenchmarkTouch: the touches a node sends to keep its active users
// online (about one per user per idle period), in batches as a sweep
// hands them out: Redis CPU per touch.
func BenchmarkTouch(b *testing.B) {
	c := dial(b, testsvc.Redis(b).URL)
	s := newStore(b, c, redisstore.Config{})
	const t0 = int64(1_700_000_000_000)
	const users = 100_000
	ctx := context.Background()
	ids := make([]string, users)
	for i := range ids {
		ids[i] = fmt.Sprint("user-", i)
	}
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Go(func() {
			for i := w; i < users; i += 64 {
				if err := s.Load(ctx, t0, &presence.Profile{UserID: ids[i]}); err != nil {
					b.Error(err)
					return
				}
				if _, err := s.Claim(ctx, t0, 7, ids[i], tracker.OwnedDevice{ID: "d", LastBeat: t0, LastActive: t0}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	ts := make([]tracker.Touch, 0, 1000)
	cpu0 := redisCPU(b, c)
	b.ResetTimer()
	for i := 0; i < b.N; i += cap(ts) {
		ts = ts[:0]
		for j := i; j < min(i+cap(ts), b.N); j++ {
			now := t0 + 1000 + int64(j)
			ts = append(ts, tracker.Touch{User: ids[j%users], Devices: []tracker.OwnedDevice{{ID: "d", LastBeat: now, LastActive: now}}})
		}
		s.Touch(ctx, t0+1000+int64(i+len(ts)), 7, ts)
		for _, t := range ts {
			if t.Err != nil || t.Change.Changed {
				b.Fatalf("touch: %+v", t)
			}
		}
	}
	b.StopTimer()
	b.ReportMetric((redisCPU(b, c)-cpu0)*1e6/float64(b.N), "redis-µs/touch")
}

// BenchmarkMemoryPerOwnedUser is BenchmarkMemoryPerUser for users whose
// device a node owns (a WebSocket held by a node, claimed under its
// lease): nothing of theirs is due in Redis.
//
// Sub-benchmarks: a short device id ("d"), one as the gateway assigns,
// and a UUID (36 bytes: an owned user of 59 bytes, within Redis's default
// hash-max-listpack-value of 64) — with that default, and raised to 128
// (docs/operations.md).
func BenchmarkMemoryPerOwnedUser(b *testing.B) {
	for _, tc := range []struct {
		name, value string
		device      func(i int) string
	}{
		{"device=d", "", func(int) string { return "d" }},
		// What the gateway assigns a client that brings no device id.
		{"device=server-assigned", "", func(i int) string { return gatewayDeviceID(i) }},
		{"device=uuid", "", uuidOf},
		{"device=uuid/listpack-value=128", "128", uuidOf},
	} {
		b.Run(tc.name, func(b *testing.B) {
			srv := testsvc.Redis(b)
			c := dial(b, srv.URL)
			lc, done := loader(b, srv.URL, c)
			ctx := context.Background()
			if tc.value != "" {
				if err := c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue("hash-max-listpack-value", tc.value).Build()).Error(); err != nil {
					b.Fatal(err)
				}
			}
			s := newStore(b, lc, redisstore.Config{Prefix: "m:"})
			base := usedMemory(b, c)
			now := time.Now().UnixMilli()
			var wg sync.WaitGroup
			for w := range 64 {
				wg.Go(func() {
					for i := w; i < b.N; i += 64 {
						id := fmt.Sprint("user-", i)
						if err := s.Load(ctx, now, &presence.Profile{UserID: id}); err != nil {
							b.Error(err)
							return
						}
						if _, err := s.Claim(ctx, now, 7, id, tracker.OwnedDevice{ID: tc.device(i), LastBeat: now, LastActive: presence.Forever}); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			drainDirty(b, s)
			done()
			b.ReportMetric(float64(usedMemory(b, c)-base)/float64(b.N), "B/user")
		})
	}
}

// gatewayDeviceID is a device id shaped like those the gateway assigns
// (internal/gateway: newDeviceID), different for each i.
func gatewayDeviceID(i int) string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(i)*11400714819323198485)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// uuidOf is a device id shaped like a UUID, different for each i.
func uuidOf(i int) string {
	return fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", uint32(i*2654435761), i&0xffff, i&0xfff, (i>>12)&0xfff, uint64(i)*11400714819323198485>>16)
}

// BenchmarkReadLayouts: a read of 1,000 users picked at random among
// 200,000 on a private Redis, with Redis's CPU per read: the store's Get
// (one HMGET per bucket the read touches: ~900 of ~4,200 for 1,000
// random ids, and the shards' counts of buckets; decoding included)
// against the naive MGET of one string key per user (no settings,
// devices or versions).
func BenchmarkReadLayouts(b *testing.B) {
	srv := testsvc.Redis(b)
	c := dial(b, srv.URL)
	s := newStore(b, c, redisstore.Config{})
	const t0 = int64(1_700_000_000_000)
	const n = 200_000
	ids := populate(b, s, n, t0)
	ctx := context.Background()
	for lo := 0; lo < n; lo += 1000 {
		batch := ids[lo:min(n, lo+1000)]
		writes := make(rueidis.Commands, len(batch))
		for i, id := range batch {
			writes[i] = c.B().Set().Key("naive:" + id).Value("online").Build()
		}
		for _, r := range c.DoMulti(ctx, writes...) {
			if err := r.Error(); err != nil {
				b.Fatal(err)
			}
		}
	}
	pick := func(k int) []string {
		out := make([]string, 1000)
		for i := range out {
			out[i] = ids[(k*7919+i*104729)%n]
		}
		return out
	}
	run := func(b *testing.B, read func(ids []string)) {
		cpu0, err := benchfix.RedisCPU(ctx, c)
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		k := 0
		for b.Loop() {
			read(pick(k))
			k++
		}
		b.StopTimer()
		cpu1, _ := benchfix.RedisCPU(ctx, c)
		b.ReportMetric((cpu1-cpu0)*1e6/float64(b.N), "redis-µs/read")
	}
	b.Run("store-Get", func(b *testing.B) {
		out := make([]presence.Snapshot, 1000)
		run(b, func(ids []string) {
			if err := s.Get(ctx, t0+1, ids, out); err != nil || !out[0].Known {
				b.Fatal(err, out[0])
			}
		})
	})
	b.Run("naive-MGET", func(b *testing.B) {
		keys := make([]string, 1000)
		run(b, func(ids []string) {
			for i, id := range ids {
				keys[i] = "naive:" + id
			}
			v, err := c.Do(ctx, c.B().Mget().Key(keys...).Build()).ToArray()
			if err != nil || len(v) != len(ids) {
				b.Fatal(err)
			}
		})
	})
}

// BenchmarkMemoryPerMembership: Redis memory per room membership (b.N of
// them, on a private Redis), the memory of the users and their devices
// (one owned device each, ids as the gateway assigns them) taken out:
// a device in one room (rooms of 100 members), and a device in ten rooms
// (b.N/10 users; rooms of 100). Room ids as an app names a document
// ("doc-" and a number). Run with -benchtime 1000000x: the figures are
// bytes, not time.
func BenchmarkMemoryPerMembership(b *testing.B) {
	for _, perDevice := range []int{1, 10} {
		b.Run(fmt.Sprintf("rooms-per-device=%d", perDevice), func(b *testing.B) {
			c := dial(b, testsvc.Redis(b).URL)
			ctx := context.Background()
			s := newStore(b, c, redisstore.Config{Prefix: "m:"})
			users := max(b.N/perDevice, 1)
			now := time.Now().UnixMilli()
			each := func(f func(i int) error) {
				var wg sync.WaitGroup
				for w := range 64 {
					wg.Go(func() {
						for i := w; i < users; i += 64 {
							if err := f(i); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				if b.Failed() {
					b.FailNow()
				}
			}
			each(func(i int) error {
				id := fmt.Sprint("user-", i)
				if err := s.Load(ctx, now, &presence.Profile{UserID: id}); err != nil {
					return err
				}
				_, err := s.Claim(ctx, now, 7, id, tracker.OwnedDevice{ID: gatewayDeviceID(i), LastBeat: now, LastActive: presence.Forever})
				return err
			})
			// Joins touch neither the users nor the dirty sets: what
			// grows from here is the memberships alone.
			base := usedMemory(b, c)
			rooms := max(users*perDevice/100, 1)
			each(func(i int) error {
				for k := range perDevice {
					// User i's rooms: perDevice of the rooms, 100 users each.
					room := fmt.Sprint("doc-", (i*perDevice+k*(rooms/perDevice+1))%rooms)
					if _, _, err := s.Join(ctx, now, fmt.Sprint("user-", i), gatewayDeviceID(i), room); err != nil {
						return err
					}
				}
				return nil
			})
			n, err := s.RoomCounts(ctx, []string{"doc-0"}, nil)
			if err != nil || n[0] == 0 {
				b.Fatalf("doc-0: %v %v", n, err)
			}
			b.ReportMetric(float64(usedMemory(b, c)-base)/float64(users*perDevice), "B/membership")
		})
	}
}
