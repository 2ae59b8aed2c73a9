package redisstore

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testsvc"
)

// evalPacked runs body after the constants and lua/packed.lua on a real
// Redis (the scripts' struct and bit libraries are Redis's own).
func evalPacked(t *testing.T, shards, buckets int, body string, args ...string) rueidis.RedisResult {
	t.Helper()
	c, err := Dial(testsvc.SharedRedis(t).URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	src, err := newScript(constants(30000, 300000, 32, 0, 600000, 5000, shards, buckets), "packed")
	if err != nil {
		t.Fatal(err)
	}
	return c.Do(context.Background(), c.B().Eval().Script(src.src+body).Numkeys(0).Arg(args...).Build())
}

// A user packed by the scripts is the user Go decodes, for every shape a
// user takes: times of 6 bytes, versions up to 2^53, each optional field
// present or not, devices open, closed, owned, held by several nodes,
// active forever or never.
func TestPackedUserDecodesInGo(t *testing.T) {
	type dev struct {
		ID  string   `json:"id"`
		LB  int64    `json:"lb"`
		LA  int64    `json:"la"`
		CL  int64    `json:"cl"`
		Own int64    `json:"own"`
		Co  []uint64 `json:"co,omitempty"`
	}
	type user struct {
		M   int    `json:"m"`
		T   string `json:"t"`
		LS  int64  `json:"ls"`
		PLS int64  `json:"pls"`
		V   uint64 `json:"v"`
		SS  int    `json:"ss"`
		SL  int    `json:"sl"`
		Pub int    `json:"pub"`
		PT  string `json:"pt"`
		PV  uint64 `json:"pv"`
		EV  int64  `json:"ev"`
		S   int64  `json:"s"`
		// Always a JSON array (cjson decodes {} as an object).
		Devs []dev `json:"devs"`
	}
	const now = 1_764_000_000_123
	long := strings.Repeat("é", 140)
	users := []user{
		{LS: now, PLS: now, V: 1, PV: 1, Pub: 1, S: forever, Devs: []dev{{ID: "d1", LB: now, LA: forever, Own: 1<<37 - 1}}},
		{Devs: []dev{}},
		{M: 3, T: "at lunch", PT: "", LS: now, PLS: now - 5, V: 1<<53 - 1, PV: 1<<53 - 9, SS: 2, SL: 1, Pub: 0, EV: now + 600000, S: now + 600000, Devs: []dev{}},
		{M: 2, T: long, PT: long, LS: now, PLS: now, V: 5 << 32, PV: 5 << 32, SS: 1, SL: 2, Pub: 3, S: now + 30000, Devs: []dev{
			{ID: "phone", LB: now - 1, LA: 0, CL: now},
			{ID: strings.Repeat("x", presence.MaxIDLen), LB: now, LA: now - 7},
			{ID: "tab", LB: now, LA: forever, Own: 42, Co: []uint64{43, 44, 45, 46, 47, 48, 49}},
		}},
		{M: 1, T: "", PT: "was here", LS: 1, PLS: 2, V: 3, PV: 3, Pub: 2, S: 4, Devs: []dev{{ID: "a", LB: 1, LA: 1}}},
		// Due further from last_seen than three bytes say, and before it.
		{LS: now, PLS: now, V: 7, PV: 7, Pub: 1, S: now + 1<<23, Devs: []dev{{ID: "web", LB: now, LA: now}}},
		{LS: now, PLS: now, V: 7, PV: 7, Pub: 1, S: now - 1<<23, Devs: []dev{{ID: "web", LB: now - 5, LA: now - 5}}},
		{LS: now, PLS: now, V: 7, PV: 7, Pub: 1, S: now - 1<<23 - 1, Devs: []dev{{ID: "web", LB: now, LA: now - 1}}},
	}
	for i, in := range users {
		j, _ := json.Marshal(in)
		body := `local u = cjson.decode(ARGV[1])
for _, d in ipairs(u.devs) do if d.co and #d.co == 0 then d.co = nil end end
local p = pack_user(u)
local back = unpack_user('k', 'id', p)
if pack_user(back) ~= p then return redis.error_reply('unpack then pack differs') end
return p`
		v, err := evalPacked(t, 256, 64, body, string(j)).ToString()
		if err != nil {
			t.Fatalf("user %d: %v", i, err)
		}
		var got packedUser
		if err := decodePacked("u", v, &got); err != nil {
			t.Fatalf("user %d: %v (%q)", i, err, v)
		}
		want := packedUser{User: presence.User{
			Profile: presence.Profile{UserID: "u", Manual: presence.Manual(in.M), Text: in.T, LastSeen: in.LS, PubLastSeen: in.PLS,
				Version: in.V, Settings: presence.Settings{Status: presence.Visibility(in.SS), LastSeen: presence.Visibility(in.SL)},
				PubText: in.PT, PubVersion: in.PV},
			Pub: presence.Status(in.Pub)}, due: in.S, evict: in.EV}
		for _, d := range in.Devs {
			want.Devices = append(want.Devices, presence.Device{ID: d.ID, LastBeat: d.LB, LastActive: d.LA, Closed: d.CL, Owner: uint64(d.Own)})
		}
		for _, d := range in.Devs {
			want.others = append(want.others, d.Co...)
		}
		if len(got.Devices) == 0 {
			got.Devices = nil
		}
		if len(got.others) == 0 {
			got.others = nil
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("user %d:\n got %+v\nwant %+v", i, got, want)
		}
		if i == 0 && len(v) > 32 {
			t.Errorf("an owned user with one short device packs into %d bytes, want ≤ 32", len(v))
		}
		if i == 5 && len(v) != 2+6+7+6+1+1+3 {
			t.Errorf("a user beating over HTTP packs into %d bytes, want %d", len(v), 2+6+7+6+1+1+3)
		}
		// A value cut short is refused, unless the cut falls between two
		// devices (the format has no count of them): it then reads the
		// devices before it.
		for n := range len(v) {
			var cut packedUser
			if err := decodePacked("u", v[:n], &cut); err == nil &&
				(len(cut.Devices) >= len(want.Devices) || !slices.Equal(cut.Devices, want.Devices[:len(cut.Devices)])) {
				t.Errorf("user %d cut to %d of %d bytes: decoded as %+v", i, n, len(v), cut)
			}
		}
	}
}

// The scripts put a user in the bucket Go reads it from, for shards of
// their first count of buckets and of counts grown from it by splits.
func TestBucketOfMatchesGo(t *testing.T) {
	for _, sbn := range [][3]int{{256, 64, 64}, {256, 64, 65}, {256, 64, 127}, {256, 64, 128}, {256, 64, 200},
		{1, 1, 1}, {1, 1, 2}, {1, 1, 3}, {1, 1, 77}, {7, 1000, 1001}, {16384, 3, 5}, {256, 1, 300}} {
		s := &Store{shards: make([]shardKeys, sbn[0]), buckets: sbn[1], nb: make([]atomic.Int64, sbn[0])}
		for i := range s.shards {
			s.shards[i] = shardKeys{tag: fmt.Sprintf("p:{%d}", i)}
			s.nb[i].Store(int64(sbn[2]))
		}
		ids := []string{"", "a", "user-1", "ünïcode", strings.Repeat("z", presence.MaxIDLen), "\xff\x00\x80"}
		for i := range 300 {
			ids = append(ids, fmt.Sprint("u", i*7919))
		}
		body := `local out = {}
for i = 1, #ARGV do
  local h = fnv32a(ARGV[i])
  local tag = 'p:{' .. string.format('%d', h % SHARDS) .. '}'
  NBUCKETS[tag] = ` + strconv.Itoa(sbn[2]) + `
  out[i] = bucket_of(tag, ARGV[i])
end
return out`
		got, err := evalPacked(t, sbn[0], sbn[1], body, ids...).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			if want, _ := s.bucketOf(id); got[i] != want {
				t.Errorf("%d shards × %d buckets grown to %d: %q in %s by the scripts, %s by Go", sbn[0], sbn[1], sbn[2], id, got[i], want)
			}
		}
	}
}

// Linear hashing: a split moves users of one bucket only, to the new
// bucket, and every bucket below the count is used.
func TestBucketIndexSplitsOneBucket(t *testing.T) {
	for _, n0 := range []int64{1, 3, 64} {
		for n := n0; n < 6*n0+5; n++ {
			used := map[int]bool{}
			moved := map[int]bool{}
			for g := uint32(0); g < 5000; g++ {
				b, after := bucketIndex(g*2654435761, n, n0), bucketIndex(g*2654435761, n+1, n0)
				used[b] = true
				if b < 0 || int64(b) >= n {
					t.Fatalf("n0 %d, n %d: bucket %d", n0, n, b)
				}
				if b != after {
					if int64(after) != n {
						t.Fatalf("n0 %d, n %d → %d: moved from %d to %d, not to the new bucket", n0, n, n+1, b, after)
					}
					moved[b] = true
				}
			}
			if len(used) != int(n) || len(moved) > 1 {
				t.Errorf("n0 %d, n %d: %d buckets used, users moved from %d buckets", n0, n, len(used), len(moved))
			}
		}
	}
}

// The scripts and Go split buckets at one number: lua/packed.lua's
// SPLIT_AT is splitAt.
func TestSplitAtMatchesTheScripts(t *testing.T) {
	src, err := luaFiles.ReadFile("lua/packed.lua")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("local SPLIT_AT = %d\n", splitAt)
	if !strings.Contains(string(src), want) {
		t.Fatalf("lua/packed.lua does not say %q", strings.TrimSpace(want))
	}
}
