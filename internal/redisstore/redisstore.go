// Package redisstore is the state store of presenced on Redis (or a Redis
// Cluster), for several nodes over one shared state: a tracker.Store and
// tracker.Leaser whose every operation is a Lua script (lua/*.lua,
// EVALSHA) applying the rules of presence.User atomically to the user's
// keys. helpers.lua holds the rules, ported from package presence;
// packed.lua the format of a user, which packed.go decodes for reads.
//
// Users are spread over 256 shards and, within a shard, over buckets that
// split as the shard grows (buckets.go): each user is one binary field of
// a small hash, its deadline in it, and the shard's due set holds a member
// per bucket; every key carries its shard as a Cluster hash tag. Beats
// that arrive while a call is in flight share the next call (beat.go);
// the devices a node owns live under its lease (lease.go), and their
// claims wait for the master's replicas (replicated.go). Expire and Dirty
// claim due and changed users atomically, so any number of nodes may sweep
// and checkpoint at once. A version floor per shard keeps versions from
// repeating when Redis loses its data (tracker.ErrStoreReset). Open opens
// on the layouts of builds before (fixed buckets, a due member per user)
// and migrates them in place (Open, formerFormats).
//
// The keys, the layout, its upgrades, the client (rueidis) and the limits
// are in docs/internals.md ("The Redis layout", "Versions"); the costs in
// docs/benchmarks.md ("Redis costs"). TestDifferential checks the scripts
// against memstore, which applies the same rules in Go.
package redisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/backendcall"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
)

var (
	_ tracker.Store       = (*Store)(nil)
	_ tracker.SharedStore = (*Store)(nil) // every ability of a store shared by nodes
)

// The defaults of Config's key prefix and of the buckets a shard starts
// with.
const (
	DefaultPrefix  = "presenced:"
	DefaultBuckets = 64
)

// Config configures a Store. The zero value takes the documented defaults.
type Config struct {
	Rules presence.Rules
	// Prefix starts every key, so several deployments (or tests) share one
	// Redis. Default DefaultPrefix. It must not contain '{'.
	Prefix string
	// Shards is the number of shards (hash tags, deadline and dirty sets).
	// Default 256. All nodes of a deployment must agree on it.
	Shards int
	// Buckets is the number of buckets each shard starts with: the hashes
	// users are packed in (lua/packed.lua). A shard adds a bucket each
	// time it holds 48 users a bucket (buckets.go), so that Redis keeps
	// every bucket in one listpack (at most 128 users:
	// hash-max-listpack-entries), a few bytes a user, whatever the
	// population. Default: the number Redis recorded (<prefix>layout:
	// Open), else DefaultBuckets. All nodes of a deployment must agree on
	// it.
	Buckets int
	// EvictAfter is how long a user with no device is kept after its last
	// change has been checkpointed. Default 10m.
	EvictAfter time.Duration
	// RoomRules are the limits of rooms (presence.RoomRules defaults).
	RoomRules presence.RoomRules
}

// Store is a tracker.Store on Redis. It is safe for concurrent use; it does
// not own the client.
type Store struct {
	c       rueidis.Client
	rules   presence.Rules
	sweeps  atomic.Uint64 // Expire calls, to rotate the first shard probed
	prefix  string
	shards  []shardKeys
	buckets int            // per shard at first (buckets.go)
	nb      []atomic.Int64 // per shard: its buckets as last read (buckets.go)

	replicas  []shardReplicas // per shard: its master's replicas (replicated.go)
	pendingMu sync.Mutex
	pending   map[string]presence.Change // changes of writes not replicated in time, by user (replicated.go)

	beat, setStatus, bye, disconnect, setSettings, load, expire, dirty, raiseFloor *script
	claim, touch, release, handoff, takeover, renewLease, takeLease                *script
	roomJoin, roomTake, roomAck, roomApply, roomRead                               *script
	floors                                                                         []atomic.Uint64 // per shard: the floor last read or raised (cold reads carry it)
	leases                                                                         string          // the leases hash (lease.go)

	roomRules presence.RoomRules
	spillMu   sync.Mutex
	spill     []presence.RoomEvent // joins and leaves for the next Expire (rooms.go)

	// Heartbeat batching, see beat.go.
	shardGroups      []beatGroup   // one per shard
	mixedGroups      []beatGroup   // standaloneGroups on one Redis, nil on a Cluster
	crossSlotRefused atomic.Bool   // a mixed call was refused: use shardGroups
	beatCalls        atomic.Uint64 // script calls that carried heartbeats
}

type shardKeys struct {
	tag   string // <prefix>{<shard>}
	due   string
	dirty string
	floor string
}

// New returns a Store that keeps its state in the Redis c talks to.
func New(c rueidis.Client, cfg Config) (*Store, error) {
	cfg.Rules = cfg.Rules.WithDefaults()
	if cfg.Rules.Epoch >= 1<<21 {
		return nil, fmt.Errorf("redisstore: epoch %d too large (versions must stay below 2^53)", cfg.Rules.Epoch)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if strings.Contains(cfg.Prefix, "{") {
		return nil, fmt.Errorf("redisstore: key prefix %q contains '{'", cfg.Prefix)
	}
	if cfg.Shards <= 0 {
		cfg.Shards = 256
	}
	if cfg.Buckets <= 0 {
		cfg.Buckets = DefaultBuckets
	}
	if cfg.EvictAfter <= 0 {
		cfg.EvictAfter = 10 * time.Minute
	}
	s := &Store{c: c, rules: cfg.Rules, prefix: cfg.Prefix, shards: make([]shardKeys, cfg.Shards), buckets: cfg.Buckets,
		nb:     make([]atomic.Int64, cfg.Shards),
		floors: make([]atomic.Uint64, cfg.Shards), leases: cfg.Prefix + "leases", replicas: make([]shardReplicas, cfg.Shards),
		roomRules: cfg.RoomRules.WithDefaults()}
	for i := range s.replicas {
		s.replicas[i].n.Store(-1)
	}
	for i := range s.nb {
		s.nb[i].Store(int64(cfg.Buckets))
	}
	for i := range s.shards {
		tag := cfg.Prefix + "{" + strconv.Itoa(i) + "}"
		s.shards[i] = shardKeys{tag: tag, due: tag + "due", dirty: tag + "dirty", floor: tag + "floor"}
	}
	r := cfg.Rules
	consts := constants(r.TTL.Milliseconds(), r.IdleAfter.Milliseconds(), int64(r.MaxDevices),
		r.Epoch<<32, cfg.EvictAfter.Milliseconds(), r.GraceMillis(), cfg.Shards, cfg.Buckets)
	for _, sc := range []struct {
		to    **script
		files []string
	}{
		{&s.beat, []string{"packed", "beat_fast", "helpers", "beat"}},
		{&s.setStatus, []string{"packed", "helpers", "set_status"}},
		{&s.bye, []string{"packed", "helpers", "bye"}},
		{&s.disconnect, []string{"packed", "helpers", "disconnect"}},
		{&s.setSettings, []string{"packed", "helpers", "set_settings"}},
		{&s.load, []string{"packed", "helpers", "load"}},
		{&s.expire, []string{"packed", "helpers", "expire"}},
		{&s.dirty, []string{"packed", "helpers", "dirty"}},
		{&s.raiseFloor, []string{"raise_floor"}},
		{&s.claim, []string{"packed", "helpers", "claim"}},
		{&s.touch, []string{"packed", "touch_fast", "helpers", "touch"}},
		{&s.release, []string{"packed", "helpers", "release"}},
		{&s.handoff, []string{"packed", "helpers", "handoff"}},
		{&s.takeover, []string{"packed", "helpers", "takeover"}},
		{&s.renewLease, []string{"lease_renew"}},
		{&s.takeLease, []string{"lease_take"}},
		{&s.roomJoin, []string{"packed", "helpers", "room_join"}},
		{&s.roomTake, []string{"packed", "helpers", "room_take"}},
		{&s.roomAck, []string{"packed", "helpers", "room_ack"}},
		{&s.roomApply, []string{"room_apply"}},
		{&s.roomRead, []string{"room_read"}},
	} {
		src, err := newScript(consts, sc.files...)
		if err != nil {
			return nil, err
		}
		sum := sha1.Sum([]byte(src.src))
		*sc.to = &script{Lua: rueidis.NewLuaScript(src.src), src: src, sha: hex.EncodeToString(sum[:])}
	}
	s.initBeats()
	return s, nil
}

// Open is what a node does with its store before it serves: the layout
// Redis holds read (its buckets are cfg.Buckets' default; another layout
// is refused; one of an older format is moved on: formerFormats), New,
// the version floors raised to this run's epoch (cfg.Rules.Epoch << 32:
// see the package doc), this layout recorded when Redis holds none yet
// (CheckLayout), and the shards' counts of buckets read (buckets.go).
func Open(ctx context.Context, c rueidis.Client, cfg Config) (*Store, error) {
	got, err := c.Do(ctx, c.B().Get().Key(prefixOf(cfg)+"layout").Build()).ToString()
	recorded := err == nil
	if err != nil && !rueidis.IsRedisNil(err) {
		return nil, fmt.Errorf("redisstore: check layout: %w", err)
	}
	if recorded && cfg.Buckets <= 0 {
		cfg.Buckets = recordedBuckets(got)
	}
	s, err := New(c, cfg)
	if err != nil {
		return nil, err
	}
	if recorded {
		if err := s.moveOn(ctx, got); err != nil {
			return nil, err
		}
	}
	if err := s.RaiseFloor(ctx, s.rules.Epoch<<32); err != nil {
		return nil, err
	}
	if !recorded {
		if err := s.CheckLayout(ctx); err != nil {
			return nil, err
		}
	}
	if err := s.refreshBuckets(ctx, nil); err != nil {
		return nil, err
	}
	return s, nil
}

// prefixOf is the key prefix of a store of cfg.
func prefixOf(cfg Config) string {
	if cfg.Prefix == "" {
		return DefaultPrefix
	}
	return cfg.Prefix
}

// recordedBuckets returns the buckets of a recorded layout, 0 if it names
// none.
func recordedBuckets(layout string) int {
	_, b, ok := strings.Cut(layout, " buckets=")
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(b)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}

// layout names how users are packed: every node must place a user in the
// same bucket and read every field of its value. "packed+split" keeps a
// bucket's due time in the due set instead of each user's (helpers.lua's
// due_member), packs times relative to others (packed.lua's sk and lk 3)
// and splits buckets as a shard grows (buckets.go); buckets= is the number
// a shard starts with.
func (s *Store) layout() string { return s.layoutAs("packed+split") }

// formerFormats are the formats of builds before this one whose users
// this build reads as they are: "packed", then "packed+face" (an invisible
// user's frozen face: packed.lua, pv?). Their shards have the buckets
// recorded, never split, and a member per user in the due sets, which the
// sweep reads and replaces with its bucket's (expire.lua).
var formerFormats = []string{"packed", "packed+face"}

func (s *Store) layoutAs(format string) string {
	return fmt.Sprintf("%s shards=%d buckets=%d", format, len(s.shards), s.buckets)
}

// recordLayout records this layout in place of a former format's.
func (s *Store) recordLayout(ctx context.Context) (err error) {
	defer callCheckLayout.Start(ctx).Done(&err)
	_, err = s.c.Do(ctx, s.c.B().Set().Key(s.prefix+"layout").Value(s.layout()).Build()).ToString()
	if err != nil {
		return fmt.Errorf("redisstore: record layout: %w", err)
	}
	return nil
}

// CheckLayout records in Redis (<prefix>layout) how this store packs its
// users — the shards and the buckets each starts with — unless a node
// recorded it before, and fails if that node's differs: nodes that
// disagree look for a user in different buckets (users reload without
// their devices, and the old copies are never read again). Open calls it
// when Redis holds no layout yet.
func (s *Store) CheckLayout(ctx context.Context) (err error) {
	defer callCheckLayout.Start(ctx).Done(&err)
	want := s.layout()
	got, err := s.c.Do(ctx, s.c.B().Set().Key(s.prefix+"layout").Value(want).Nx().Get().Build()).ToString()
	switch {
	case rueidis.IsRedisNil(err):
		return nil // recorded now
	case err != nil:
		return fmt.Errorf("redisstore: check layout: %w", err)
	}
	return s.layoutErr(got)
}

// moveOn accepts got, the layout Redis holds: this one, or a former
// format's of the same numbers, whose shards then get their count of
// users (buckets.go) and which this layout replaces, so that a node of
// that build no longer starts. Another layout is an error.
func (s *Store) moveOn(ctx context.Context, got string) error {
	for _, f := range formerFormats {
		if got == s.layoutAs(f) {
			if err := s.countUsers(ctx); err != nil {
				return err
			}
			return s.recordLayout(ctx)
		}
	}
	return s.layoutErr(got)
}

// countUsers sets the count of users of every shard that has none (a
// shard of a former format) to the users its buckets hold: one HLEN per
// bucket, 512 in a round trip.
func (s *Store) countUsers(ctx context.Context) error {
	const batch = 512
	total := len(s.shards) * s.buckets
	held := make([]int64, len(s.shards))
	cmds := make(rueidis.Commands, 0, batch)
	for lo := 0; lo < total; lo += batch {
		cmds = cmds[:0]
		for i := lo; i < min(total, lo+batch); i++ {
			cmds = append(cmds, s.c.B().Hlen().Key(s.shards[i/s.buckets].bucketKey(i%s.buckets)).Build())
		}
		for j, r := range s.c.DoMulti(ctx, cmds...) {
			n, err := r.AsInt64()
			if err != nil {
				return fmt.Errorf("redisstore: count users: %w", err)
			}
			held[(lo+j)/s.buckets] += n
		}
	}
	cmds = cmds[:0]
	for k, n := range held {
		cmds = append(cmds, s.c.B().Set().Key(s.shards[k].tag+"c").Value(i64(n)).Nx().Build())
	}
	for _, r := range s.c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
			return fmt.Errorf("redisstore: count users: %w", err)
		}
	}
	return nil
}

// layoutErr is the error of a node whose layout is not got, the one Redis
// holds.
func (s *Store) layoutErr(got string) error {
	if want := s.layout(); got != want {
		return fmt.Errorf("redisstore: Redis holds users as %q (key %slayout) but this node packs them as %q: "+
			"start every node with the same -redis-buckets, or leave it unset to take the one recorded", got, s.prefix, want)
	}
	return nil
}

// Ping sends a PING: the tracker's probe of whether Redis answers again
// after an outage.
func (s *Store) Ping(ctx context.Context) (err error) {
	defer callPing.Start(ctx).Done(&err)
	if err := s.c.Do(ctx, s.c.B().Ping().Build()).Error(); err != nil {
		return fmt.Errorf("redisstore: ping: %w", err)
	}
	return nil
}

// Parts implements tracker.Partitioned. On a Redis Cluster every shard is
// a part: its keys share one slot ({shard} hash tag), so one master holds
// all of them and they fail together and only together. One Redis fails
// as a whole: 1.
func (s *Store) Parts() int {
	if s.c.Mode() == rueidis.ClientModeCluster {
		return len(s.shards)
	}
	return 1
}

// Part implements tracker.Partitioned: the shard of user.
func (s *Store) Part(user string) int { return s.shardIndex(user) }

// PingPart implements tracker.Partitioned: a round trip to the master of
// shard part (an EXISTS of its floor key).
func (s *Store) PingPart(ctx context.Context, part int) (err error) {
	defer callPingPart.Start(ctx).Done(&err)
	if err := s.c.Do(ctx, s.c.B().Exists().Key(s.shards[part].floor).Build()).Error(); err != nil {
		return fmt.Errorf("redisstore: ping shard %d: %w", part, err)
	}
	return nil
}

// Dial returns a rueidis client for a redis:// or rediss:// URL (for a
// Cluster, list several addresses: redis://a:6379?addr=b:6379).
func Dial(url string) (rueidis.Client, error) {
	opt, err := rueidis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redisstore: %w", err)
	}
	opt.DisableCache = true
	// RESP2: a hash comes back as a flat array, which a takeover and a
	// replica's fill decode without building a map per bucket (RESP3
	// answers a map, which rueidis exposes only as a Go map).
	opt.AlwaysRESP2 = true
	// Claims that wait for the replicas (replicated.go) take a connection
	// of their own from this pool, per Redis node: a reconnect storm must
	// not open a thousand (rueidis's default) from every node. 32 in use
	// at once carry tens of thousands of claims a second, and ~300 a
	// second while a replica lags (each then holds its connection for
	// WAIT's 100 ms); idle ones close. (Measured: 300 claims at once
	// opened 2 × the pool's size on their master.)
	opt.BlockingPoolSize = 32
	opt.BlockingPoolCleanup = time.Minute
	opt.BlockingPoolMinSize = 2
	c, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, fmt.Errorf("redisstore: %w", err)
	}
	return c, nil
}

func i64(n int64) string { return strconv.FormatInt(n, 10) }

// userKeys returns the keys of a user's scripts: bucket, due, dirty.
func (s *Store) userKeys(user string) []string {
	b, sk := s.bucketOf(user)
	return []string{b, sk.due, sk.dirty}
}

// script is one operation's Lua script, with what it takes to name the
// file and line of lua/ behind an error of Redis.
type script struct {
	*rueidis.Lua
	src luaScript
	sha string // hex SHA-1 of src.src, as EVALSHA names it
}

// execMulti runs the script once per exec, in one pipelined round trip
// per Redis node: EVALSHA, then EVAL for the calls whose node did not know
// the script (NOSCRIPT: a node restarted, or a replica just promoted).
// rueidis's ExecMulti first sends SCRIPT LOAD to every node of a Cluster —
// a round trip more for every sweep and checkpoint, and a failure of all
// calls when any one node is down; here a node that fails fails only the
// calls it serves.
func (sc *script) execMulti(ctx context.Context, c rueidis.Client, execs ...rueidis.LuaExec) []rueidis.RedisResult {
	cmds := make(rueidis.Commands, len(execs))
	for i, e := range execs {
		cmds[i] = c.B().Evalsha().Sha1(sc.sha).Numkeys(int64(len(e.Keys))).Key(e.Keys...).Arg(e.Args...).Build()
	}
	res := c.DoMulti(ctx, cmds...)
	var again []int
	for i, r := range res {
		if re, ok := rueidis.IsRedisErr(r.Error()); ok && re.IsNoScript() {
			again = append(again, i)
		}
	}
	if len(again) == 0 {
		return res
	}
	cmds = cmds[:0]
	for _, i := range again {
		e := execs[i]
		cmds = append(cmds, c.B().Eval().Script(sc.src.src).Numkeys(int64(len(e.Keys))).Key(e.Keys...).Arg(e.Args...).Build())
	}
	for j, r := range c.DoMulti(ctx, cmds...) {
		res[again[j]] = r
	}
	return res
}

// err maps the script lines err names to the files of lua/.
func (s *script) err(err error) error { return s.src.scriptError(err) }

// SetStatus implements tracker.Store.
func (s *Store) SetStatus(ctx context.Context, now int64, user string, m presence.Manual, text string) (_ presence.Change, err error) {
	defer callSetStatus.Start(ctx).Done(&err)
	return s.changeOf(ctx, s.setStatus.Exec(ctx, s.c, s.userKeys(user), []string{user, i64(now), strconv.Itoa(int(m)), text}), s.setStatus, user, now, "set status")
}

// Bye implements tracker.Store.
func (s *Store) Bye(ctx context.Context, now int64, user, device string) (_ presence.Change, err error) {
	defer callBye.Start(ctx).Done(&err)
	return s.changeOf(ctx, s.bye.Exec(ctx, s.c, s.userKeys(user), []string{user, i64(now), device}), s.bye, user, now, "bye")
}

// Disconnect implements tracker.Store.
func (s *Store) Disconnect(ctx context.Context, now int64, user, device string, since int64) (_ presence.Change, err error) {
	defer callDisconnect.Start(ctx).Done(&err)
	return s.changeOf(ctx, s.disconnect.Exec(ctx, s.c, s.userKeys(user), []string{user, i64(now), device, i64(since)}),
		s.disconnect, user, now, "disconnect")
}

// changeOf decodes the reply of an operation's script, and applies the
// room ops it made (rooms.go).
func (s *Store) changeOf(ctx context.Context, r rueidis.RedisResult, sc *script, user string, now int64, op string) (presence.Change, error) {
	m, err := r.ToMessage()
	if err != nil {
		return presence.Change{}, wrapErr(op, sc.err(err))
	}
	ch, rooms, err := s.changeRooms(m, user, now, op)
	if err == nil && rooms {
		s.drainRooms(ctx, now, user, &ch)
	}
	return ch, err
}

func wrapErr(op string, err error) error { return fmt.Errorf("redisstore: %s: %w", op, err) }

func errReplyCount(got, want int) error {
	return fmt.Errorf("unexpected reply of %d elements for %d beats", got, want)
}

// change decodes one operation's reply: {0}, {-1}, {-2} or a change.
func (s *Store) change(m rueidis.RedisMessage, user string, now int64, op string) (presence.Change, error) {
	ch, _, err := s.changeRooms(m, user, now, op)
	return ch, err
}

// changeRooms is change, and reports whether the script made room ops:
// helpers.lua's rooms_mark added an element "\x01" to its reply.
func (s *Store) changeRooms(m rueidis.RedisMessage, user string, now int64, op string) (_ presence.Change, rooms bool, err error) {
	arr, err := m.ToArray()
	if err != nil {
		return presence.Change{}, false, wrapErr(op, err)
	}
	if n := len(arr); n == 2 || n == 11 || n == 13 {
		if mark, err := arr[n-1].ToString(); err == nil && mark == "\x01" {
			arr, rooms = arr[:n-1], true
		}
	}
	ch, err := s.decodeReply(arr, user, now, op)
	return ch, rooms, err
}

// decodeReply decodes a reply without its mark.
func (s *Store) decodeReply(arr []rueidis.RedisMessage, user string, now int64, op string) (presence.Change, error) {
	if len(arr) == 1 {
		switch code, _ := arr[0].AsInt64(); code {
		case 0:
			return presence.Change{}, nil
		case -1:
			return presence.Change{}, tracker.ErrNotLoaded
		case -2:
			return presence.Change{}, presence.ErrTooManyDevices
		}
	}
	ch, err := decodeChange(arr, now, false)
	if err != nil {
		return presence.Change{}, fmt.Errorf("redisstore: %s: %w", op, err)
	}
	ch.Event.UserID = user
	return ch, nil
}

// decodeChange decodes {kind, status, prev, text, public last_seen,
// version, settings status, settings last_seen, true status, the user's
// own text}: kind 1 a change (helpers.lua's settle), 3 a change only the
// user sees (set_status.lua), and 2 a change of settings
// (set_settings.lua), which adds the settings before. With claim set the
// first element is the user's id instead (expire, takeover: changes of
// settle).
func decodeChange(arr []rueidis.RedisMessage, now int64, claim bool) (presence.Change, error) {
	if len(arr) != 10 && len(arr) != 12 {
		return presence.Change{}, fmt.Errorf("unexpected reply of %d elements", len(arr))
	}
	var n [12]int64
	n[0] = 1
	first := 0
	if claim {
		first = 1
	}
	for i := first; i < len(arr); i++ {
		if i == 3 || i == 9 {
			continue
		}
		v, err := arr[i].AsInt64()
		if err != nil {
			return presence.Change{}, err
		}
		n[i] = v
	}
	text, err := arr[3].ToString()
	if err != nil {
		return presence.Change{}, err
	}
	self, err := arr[9].ToString()
	if err != nil {
		return presence.Change{}, err
	}
	if kind := n[0]; kind < 1 || kind > 3 || (kind == 2) != (len(arr) == 12) {
		return presence.Change{}, fmt.Errorf("unexpected reply of kind %d and %d elements", kind, len(arr))
	}
	ch := presence.Change{Changed: true, Event: presence.Event{
		Status:   presence.Status(n[1]),
		Prev:     presence.Status(n[2]),
		Text:     text,
		LastSeen: n[4],
		Version:  uint64(n[5]),
		At:       now,
		Settings: presence.Settings{Status: presence.Visibility(n[6]), LastSeen: presence.Visibility(n[7])},
		Self:     presence.Status(n[8]),
		SelfText: self,
		SelfOnly: n[0] == 3,
	}}
	if len(arr) == 12 {
		ch.Event.SettingsOnly, ch.Event.SettingsChanged = true, true
		ch.Event.PrevSettings = presence.Settings{Status: presence.Visibility(n[10]), LastSeen: presence.Visibility(n[11])}
	}
	return ch, nil
}

// SetSettings implements tracker.Store.
func (s *Store) SetSettings(ctx context.Context, now int64, user string, set *presence.Settings) (_ presence.Change, err error) {
	defer callSetSettings.Start(ctx).Done(&err)
	args := []string{user, i64(now), "", ""} // keep them
	if set != nil {
		args[2], args[3] = strconv.Itoa(int(set.Status)), strconv.Itoa(int(set.LastSeen))
	}
	return s.changeOf(ctx, s.setSettings.Exec(ctx, s.c, s.userKeys(user), args), s.setSettings, user, now, "set settings")
}

// Load implements tracker.Store.
func (s *Store) Load(ctx context.Context, now int64, p *presence.Profile) (err error) {
	defer callLoad.Start(ctx).Done(&err)
	k, b := s.place(p.UserID)
	sk := &s.shards[k]
	r, err := s.load.Exec(ctx, s.c, []string{sk.bucketKey(b), sk.due, sk.floor}, []string{
		p.UserID, i64(now), strconv.Itoa(int(p.Manual)), p.Text, i64(p.LastSeen), i64(p.PubLastSeen),
		strconv.FormatUint(p.Version, 10), strconv.Itoa(int(p.Settings.Status)), strconv.Itoa(int(p.Settings.LastSeen)),
		p.PubText, strconv.FormatUint(p.PubVersion, 10),
	}).AsIntSlice()
	if err == nil && len(r) != 2 {
		err = fmt.Errorf("unexpected reply of %d elements", len(r))
	}
	if err != nil {
		return fmt.Errorf("redisstore: load: %w", s.load.err(err))
	}
	// The shard's buckets as of now: the user's next calls name its
	// bucket (a node loads a user before it writes it).
	s.learnBuckets(k, r[1])
	if r[0] == -3 {
		return fmt.Errorf("redisstore: load %q: shard %s has no version floor: %w", p.UserID, sk.tag, tracker.ErrStoreReset)
	}
	return nil
}

// RaiseFloor raises the version floor of every shard to floor, unless a
// shard's is higher already (see the package doc). A node calls it at
// start with its epoch<<32, and the tracker after a loss of Redis's data
// with a new epoch's.
func (s *Store) RaiseFloor(ctx context.Context, floor uint64) (err error) {
	defer callRaiseFloor.Start(ctx).Done(&err)
	// The rooms' shards have floors of their own (a room's versions start
	// above its shard's room floor), raised first in the same round trip:
	// the users' floors are what CheckFloor looks for, so a call cut short
	// (a timeout) leaves them for the next reset to raise, rooms and all.
	n := len(s.shards)
	execs := make([]rueidis.LuaExec, 2*n)
	for i := range s.shards {
		execs[i] = rueidis.LuaExec{Keys: []string{s.roomFloor(i)}, Args: []string{strconv.FormatUint(floor, 10)}}
		execs[n+i] = rueidis.LuaExec{Keys: []string{s.shards[i].floor}, Args: []string{strconv.FormatUint(floor, 10)}}
	}
	var firstErr error
	var failed []int
	for j, r := range s.raiseFloor.execMulti(ctx, s.c, execs...) {
		i := j % n
		v, err := r.ToString()
		if err == nil && j >= n {
			var f int64
			if f, err = parseDec(v); err == nil {
				s.floors[i].Store(uint64(f))
			}
		}
		if err != nil {
			failed = append(failed, i)
		}
		firstErr = firstOf(firstErr, err)
	}
	slices.Sort(failed)
	return floorErr("raise floor", n, slices.Compact(failed), s.raiseFloor.err(firstErr))
}

// floorErr is the error of a call on every shard's floor: nil, a
// tracker.PartialError naming the shards that failed when others answered
// (a Cluster master down), or the error.
func floorErr(what string, shards int, failed []int, err error) error {
	switch {
	case len(failed) == 0:
		return nil
	case len(failed) < shards:
		return &tracker.PartialError{Failed: failed, Parts: failed, Err: fmt.Errorf("redisstore: %s: %w", what, err)}
	}
	return fmt.Errorf("redisstore: %s: %w", what, err)
}

// CheckFloor reads the version floor of every shard and reports whether
// each has one: a shard without it lost its data (see the package doc).
// Shards that do not answer (a Cluster master down) are named in a
// tracker.PartialError, and the answer is about the others.
func (s *Store) CheckFloor(ctx context.Context) (_ bool, err error) {
	defer callCheckFloor.Start(ctx).Done(&err)
	cmds := make(rueidis.Commands, len(s.shards))
	for i := range s.shards {
		cmds[i] = s.c.B().Get().Key(s.shards[i].floor).Build()
	}
	ok := true
	var failed []int
	var firstErr error
	for i, r := range s.c.DoMulti(ctx, cmds...) {
		v, err := r.ToString()
		if rueidis.IsRedisNil(err) {
			ok = false
			continue
		}
		if err != nil {
			failed = append(failed, i)
			firstErr = firstOf(firstErr, err)
			continue
		}
		f, err := parseDec(v)
		if err != nil {
			return false, fmt.Errorf("redisstore: check floor of shard %d: %w", i, err)
		}
		s.floors[i].Store(uint64(f))
	}
	// With a shard that did not answer, ok speaks of the others.
	return ok, floorErr("check floor", len(s.shards), failed, firstErr)
}

// Expire implements tracker.Store. Each round is two pipelined round
// trips: a probe of every shard for a due member, then the claiming
// script on the due shards, max shared between them; rounds repeat while
// a shard may have more due and the budget allows.
func (s *Store) Expire(ctx context.Context, now int64, max int, out []presence.Change) ([]presence.Change, error) {
	return s.ExpireParts(ctx, now, max, nil, out)
}

// ExpireParts implements tracker.PartSweeper: Expire of the shards skip
// does not name (nil: all).
func (s *Store) ExpireParts(ctx context.Context, now int64, max int, skip func(part int) bool, out []presence.Change) (_ []presence.Change, err error) {
	defer callExpireParts.Start(ctx).Done(&err)
	start := len(out)
	// Start the probe at a rotating shard, so a small max does not always
	// favour the first shards.
	first := int(s.sweeps.Add(1) % uint64(len(s.shards)))
	probes := make(rueidis.Commands, 0, len(s.shards))
	probed := make([]int, 0, len(s.shards))
	var due []int
	var execs []rueidis.LuaExec
	var claims []*roomClaim
	out = s.takeSpilled(out)
	// A shard whose node does not answer (a Cluster master down) is
	// skipped, and the others swept: the error is then a PartialError
	// naming the shards that failed.
	var failedShards []int
	var failed, answered int
	var firstErr error
	for len(out)-start < max {
		probes, probed = probes[:0], probed[:0]
		for i := range s.shards {
			k := (first + i) % len(s.shards)
			if skip != nil && skip(k) {
				continue
			}
			sk := &s.shards[k]
			probes = append(probes, s.c.B().Zrangebyscore().Key(sk.due).Min("-inf").Max(i64(now)).Limit(0, 1).Build())
			probed = append(probed, k)
		}
		if len(probes) == 0 {
			break
		}
		due = due[:0]
		for i, r := range s.c.DoMulti(ctx, probes...) {
			m, err := r.AsStrSlice()
			if err != nil {
				failed, firstErr = failed+1, firstOf(firstErr, err)
				failedShards = append(failedShards, probed[i])
				continue
			}
			answered++
			if len(m) > 0 {
				due = append(due, probed[i])
			}
		}
		if len(due) == 0 || ctx.Err() != nil {
			// Nothing due, or shards that did not answer used up the
			// time: the due ones, which did, are not named as failed
			// (they are swept by the next call).
			break
		}
		left := max - (len(out) - start)
		more := false // some due shard may hold more due
		if len(due) > left {
			due, more = due[:left], true
		}
		per := left / len(due)
		execs = execs[:0]
		for _, i := range due {
			sk := &s.shards[i]
			execs = append(execs, rueidis.LuaExec{Keys: []string{sk.due, sk.dirty},
				Args: []string{i64(now), strconv.Itoa(per), sk.tag}})
		}
		// A failed shard does not drop the changes the others claimed:
		// they are gone from Redis and must reach the caller.
		for j, r := range s.expire.execMulti(ctx, s.c, execs...) {
			arr, err := r.ToArray()
			if err != nil {
				failed, firstErr = failed+1, firstOf(firstErr, s.expire.err(err))
				failedShards = append(failedShards, due[j])
				continue
			}
			if len(arr) >= per {
				more = true // a bucket swept may give more than asked
			}
			var bad int
			out, claims, bad, err = appendClaims(out, claims, arr, now)
			failed, firstErr = failed+bad, firstOf(firstErr, err)
		}
		if len(claims) > 0 {
			// The room ops of the devices these calls ended, and those
			// whose applier died: applied here, each with its user's
			// change (they ride in a Change of their own).
			// Ops a room's master did not take (down, failing over) stay
			// claimed: a sweep applies them once the claim lapses. The
			// users' shards were swept all the same.
			evs, _ := s.applyRooms(ctx, now, claims)
			if len(evs) > 0 {
				out = append(out, presence.Change{Rooms: evs})
			}
			claims = claims[:0]
		}
		if !more || failed > 0 {
			// Every due shard was drained (a new probe would find only
			// what writers added meanwhile), or some shard failed.
			break
		}
	}
	err = shardsErr("expire", failed, answered, firstErr)
	var pe *tracker.PartialError
	if errors.As(err, &pe) {
		slices.Sort(failedShards)
		pe.Parts = slices.Compact(failedShards)
	}
	return out, err
}

// shardsErr is the error of a call made on every shard: nil, the error
// of a store that answered for no shard, or a PartialError when some
// shards answered (a Cluster master down: the others' work is done).
func shardsErr(op string, failed, answered int, err error) error {
	switch {
	case failed == 0:
		return nil
	case answered == 0:
		return fmt.Errorf("redisstore: %s: %w", op, err)
	}
	return &tracker.PartialError{Err: fmt.Errorf("redisstore: %s: %d shards failed: %w", op, failed, err)}
}

// appendClaims appends to out the changes of a script that returns them
// as {user, change…} (expire, takeover), and to claims the users' room
// ops it claimed ({"\x01" user, claim, ops}: expire); it counts those it
// cannot decode and returns the first such error.
func appendClaims(out []presence.Change, claims []*roomClaim, arr []rueidis.RedisMessage, now int64) (_ []presence.Change, _ []*roomClaim, bad int, err error) {
	for _, m := range arr {
		var room bool
		var e error
		if claims, room, e = appendRoomClaim(claims, m); room || e != nil {
			if e != nil {
				bad, err = bad+1, firstOf(err, e)
			}
			continue
		}
		c, e := decodeClaim(m, now)
		if e != nil {
			bad, err = bad+1, firstOf(err, e)
			continue
		}
		out = append(out, c)
	}
	return out, claims, bad, err
}

// decodeClaim decodes a change returned by the expire script: {user,
// change…}.
func decodeClaim(m rueidis.RedisMessage, now int64) (presence.Change, error) {
	arr, err := m.ToArray()
	if err != nil {
		return presence.Change{}, err
	}
	c, err := decodeChange(arr, now, true)
	if err != nil {
		return presence.Change{}, err
	}
	if c.Event.UserID, err = arr[0].ToString(); err != nil {
		return presence.Change{}, err
	}
	return c, nil
}

// Get implements tracker.Store. A read is one HMGET per bucket its users
// fall in (lua/packed.lua), all in one pipelined round trip: for 1,000
// users among 1M about 1,000 calls, each answering a packed user or two,
// from which presence.User derives each snapshot at now. When some users
// are not found, a second round trip reads the count of buckets of their
// shards (one MGET on one Redis, a GET per shard on a Cluster): a user
// missed in a shard whose count grew since it was placed may have moved
// to a new bucket (buckets.go), and is read again there. (The tracker
// reads the users Redis does not hold from the durable store anyway.)
func (s *Store) Get(ctx context.Context, now int64, ids []string, out []presence.Snapshot) (err error) {
	defer callGet.Start(ctx).Done(&err)
	return s.get(ctx, now, ids, out, false)
}

// ReadPublished fills out[i] with ids[i] as ScanReads yields it (the
// status last published, nothing due applied), a user the store does not
// hold with Known false and its shard's floor as version: a bounded read
// replica's read of the users it does not hold. Errors are Get's.
func (s *Store) ReadPublished(ctx context.Context, ids []string, out []presence.Snapshot) (err error) {
	defer callReadPublished.Start(ctx).Done(&err)
	return s.get(ctx, 0, ids, out, true)
}

// get is Get, and ReadPublished if published.
func (s *Store) get(ctx context.Context, now int64, ids []string, out []presence.Snapshot, published bool) error {
	if len(ids) == 0 {
		return nil
	}
	type place struct{ shard, bucket int32 }
	places := make([]place, len(ids))
	order := make([]int32, len(ids))
	for i := range order {
		order[i] = int32(i)
	}
	var failed []int // users whose Redis node did not answer (PartialError)
	var firstErr error
	var u packedUser
	used := map[int32]int64{} // per shard touched: the count of buckets the round placed users by
	var cmds rueidis.Commands
	var runs [][]int32 // each call's indexes of ids
	var touched []int32
	names := make([]string, 0, 16)
	for round := 0; len(order) > 0; round++ {
		// Group the ids by bucket: sort their indexes by (shard, bucket).
		clear(used)
		for _, i := range order {
			k, b := s.place(ids[i])
			places[i] = place{int32(k), int32(b)}
			if _, ok := used[int32(k)]; !ok {
				used[int32(k)] = s.nb[k].Load()
			}
		}
		slices.SortFunc(order, func(a, b int32) int {
			pa, pb := places[a], places[b]
			if pa.shard != pb.shard {
				return int(pa.shard - pb.shard)
			}
			return int(pa.bucket - pb.bucket)
		})
		cmds, runs = cmds[:0], runs[:0]
		for start := 0; start < len(order); {
			end := start + 1
			for end < len(order) && places[order[end]] == places[order[start]] {
				end++
			}
			pl := places[order[start]]
			names = names[:0]
			for _, i := range order[start:end] {
				names = append(names, ids[i])
			}
			cmds = append(cmds, s.c.B().Hmget().Key(s.shards[pl.shard].bucketKey(int(pl.bucket))).Field(names...).Build())
			runs = append(runs, order[start:end])
			start = end
		}
		var nils []int32 // not found: not held, or moved by a split
		for c, r := range s.c.DoMulti(ctx, cmds...) {
			run := runs[c]
			f, err := r.ToArray()
			if err == nil && len(f) != len(run) {
				return fmt.Errorf("redisstore: get: HMGET answered %d fields, want %d", len(f), len(run))
			}
			if err != nil {
				for _, i := range run {
					failed = append(failed, int(i))
				}
				firstErr = firstOf(firstErr, err)
				continue
			}
			for j, i := range run {
				id := ids[i]
				if f[j].IsNil() {
					nils = append(nils, i)
					continue
				}
				v, err := f[j].ToString()
				if err == nil {
					err = decodePacked(id, v, &u)
				}
				if err != nil {
					return fmt.Errorf("redisstore: get %q: %w", id, err)
				}
				if published {
					publishedSnapshot(&u, &out[i])
				} else {
					s.snapshot(&u, now, &out[i])
				}
			}
		}
		if len(nils) == 0 {
			break
		}
		// The shards' counts, read after the HMGETs: a user missed in a
		// shard whose count is still the one it was placed by is not
		// held; in one that grew it may have moved, and is read again.
		touched = touched[:0]
		for _, i := range nils { // in (shard, bucket) order
			if k := places[i].shard; len(touched) == 0 || touched[len(touched)-1] != k {
				touched = append(touched, k)
			}
		}
		cmds, perShard := s.appendCountReads(cmds[:0], touched)
		counts, countErr := s.countsOf(s.c.DoMulti(ctx, cmds...), touched, perShard)
		var missed []int32
		for _, i := range nils {
			k := places[i].shard
			n, ok := counts[k]
			switch {
			case !ok:
				// The count was not read: the user may have moved.
				failed = append(failed, int(i))
				firstErr = firstOf(firstErr, countErr)
			case n != used[k] && round < 3:
				missed = append(missed, i)
			default:
				out[i] = presence.Snapshot{UserID: ids[i], Version: s.floors[k].Load()}
			}
		}
		order = missed
	}
	return getErr(failed, len(ids), firstErr)
}

// appendCountReads appends to cmds the reads of the count of buckets of
// each shard touched (countsOf reads their replies): one MGET on one
// Redis, a GET per shard (perShard) on a Cluster or behind a proxy that
// refused a call across slots.
func (s *Store) appendCountReads(cmds rueidis.Commands, touched []int32) (_ rueidis.Commands, perShard bool) {
	if s.mixedGroups == nil || s.crossSlotRefused.Load() {
		for _, k := range touched {
			cmds = append(cmds, s.c.B().Get().Key(s.shards[k].countKey()).Build())
		}
		return cmds, true
	}
	keys := make([]string, len(touched))
	for j, k := range touched {
		keys[j] = s.shards[k].countKey()
	}
	return append(cmds, s.c.B().Mget().Key(keys...).Build()), false
}

// countsOf returns the counts of buckets that res, the replies of
// appendCountReads, read of the shards touched, and stores them in s.nb;
// a shard whose count was not read is missing, and the first error says
// why.
func (s *Store) countsOf(res []rueidis.RedisResult, touched []int32, perShard bool) (map[int32]int64, error) {
	counts := make(map[int32]int64, len(touched))
	var firstErr error
	set := func(k int32, v string, err error) {
		n, err := parseBuckets(v, err, int64(s.buckets))
		if err != nil {
			firstErr = firstOf(firstErr, err)
			return
		}
		counts[k] = n
		s.nb[k].Store(n)
	}
	if perShard {
		for j, k := range touched {
			v, err := res[j].ToString()
			set(k, v, err)
		}
		return counts, firstErr
	}
	arr, err := res[0].ToArray()
	if err != nil && strings.Contains(err.Error(), "CROSSSLOT") {
		s.crossSlotRefused.Store(true) // a proxy for a sharded Redis: GET each from now on
	}
	if err == nil && len(arr) != len(touched) {
		err = fmt.Errorf("MGET answered %d counts, want %d", len(arr), len(touched))
	}
	if err != nil {
		return counts, err
	}
	for j, k := range touched {
		v, err := arr[j].ToString()
		set(k, v, err)
	}
	return counts, firstErr
}

// snapshot fills out with u at now, as a read shows it.
func (s *Store) snapshot(u *packedUser, now int64, out *presence.Snapshot) {
	u.Snapshot(&s.rules, now, out)
	for _, d := range u.Devices {
		if d.Owner != 0 {
			seenNow(out, now)
			break
		}
	}
}

// getErr is Get's error: nil, the error of a store that answered for
// nobody, or a PartialError naming the users whose node did not answer
// (a Cluster master down) when the others were read.
func getErr(failed []int, n int, err error) error {
	switch {
	case len(failed) == 0:
		return nil
	case len(failed) == n:
		return fmt.Errorf("redisstore: get: %w", err)
	}
	slices.Sort(failed)
	return &tracker.PartialError{Failed: failed, Err: fmt.Errorf("redisstore: get: %w", err)}
}

// seenNow makes the last_seen of a user present through a device a node
// owns now: Redis hears of such a device only when something visible
// changes, its owner vouches for it while it renews its lease, and the
// last_seen of a present user is the moment they are read. (An invisible
// user's public last_seen stays frozen.)
func seenNow(out *presence.Snapshot, now int64) {
	if out.Status == presence.Offline {
		return
	}
	out.LastSeen = max(out.LastSeen, now)
	if out.Status != presence.Invisible {
		out.PubLastSeen = max(out.PubLastSeen, now)
	}
}

// parseDec parses a decimal integer as the scripts write them (%d: an
// optional '-' and digits). A read of 1,000 users parses 9,000 of them;
// this loop takes a fraction of strconv.ParseInt's time for the common
// case and leaves anything longer than 18 digits (or not a number) to it.
func parseDec(s string) (int64, error) {
	d := s
	if len(d) > 0 && d[0] == '-' {
		d = d[1:]
	}
	if len(d) == 0 || len(d) > 18 {
		return strconv.ParseInt(s, 10, 64)
	}
	var n int64
	for i := 0; i < len(d); i++ {
		c := d[i] - '0'
		if c > 9 {
			return strconv.ParseInt(s, 10, 64)
		}
		n = n*10 + int64(c)
	}
	if len(d) < len(s) {
		n = -n
	}
	return n, nil
}

// Dirty implements tracker.Store: one pipelined round trip asks every
// shard whether its dirty set holds anyone (EXISTS: a fraction of a
// script's cost, and most shards of a node with devices it owns are
// clean most seconds), and a second drains the sets that do, each by its
// own script.
func (s *Store) Dirty(ctx context.Context, out []presence.Profile) ([]presence.Profile, error) {
	return s.DirtyParts(ctx, nil, out)
}

// DirtyParts implements tracker.PartSweeper: Dirty of the shards skip
// does not name (nil: all).
func (s *Store) DirtyParts(ctx context.Context, skip func(part int) bool, out []presence.Profile) (_ []presence.Profile, err error) {
	defer callDirtyParts.Start(ctx).Done(&err)
	probes := make(rueidis.Commands, 0, len(s.shards))
	probed := make([]int, 0, len(s.shards))
	for i := range s.shards {
		if skip != nil && skip(i) {
			continue
		}
		probes = append(probes, s.c.B().Exists().Key(s.shards[i].dirty).Build())
		probed = append(probed, i)
	}
	if len(probes) == 0 {
		return out, nil
	}
	// The same round trip reads the shards' counts of buckets, so that
	// this node names the buckets of users that moved (buckets.go) within
	// a second, even if it reads none of them.
	n := len(probes)
	for _, i := range probed {
		probes = append(probes, s.c.B().Get().Key(s.shards[i].countKey()).Build())
	}
	res := s.c.DoMulti(ctx, probes...)
	for j, r := range res[n:] {
		v, err := r.ToString()
		if nb, err := parseBuckets(v, err, int64(s.buckets)); err == nil {
			s.nb[probed[j]].Store(nb)
		}
	}
	var execs []rueidis.LuaExec
	var failed, answered int
	var firstErr error
	for j, r := range res[:n] {
		i := probed[j]
		n, err := r.AsInt64()
		if err != nil {
			failed, firstErr = failed+1, firstOf(firstErr, err)
			continue
		}
		answered++
		if n > 0 {
			execs = append(execs, rueidis.LuaExec{Keys: []string{s.shards[i].dirty}, Args: []string{s.shards[i].tag}})
		}
	}
	if len(execs) == 0 {
		return out, shardsErr("dirty", failed, answered, firstErr)
	}
	for _, r := range s.dirty.execMulti(ctx, s.c, execs...) {
		arr, err := r.ToArray()
		if err != nil {
			// Keep what other shards drained: it is gone from Redis.
			failed, firstErr = failed+1, firstOf(firstErr, s.dirty.err(err))
			continue
		}
		for _, m := range arr {
			p, err := decodeProfile(m)
			if err != nil {
				failed, firstErr = failed+1, firstOf(firstErr, err)
				continue
			}
			out = append(out, p)
		}
	}
	return out, shardsErr("dirty", failed, answered, firstErr)
}

func firstOf(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// decodeProfile decodes {user, manual, text, last_seen, public last_seen,
// version, settings status, settings last_seen, public text, public
// version}.
func decodeProfile(m rueidis.RedisMessage) (presence.Profile, error) {
	f, err := m.AsStrSlice()
	if err != nil {
		return presence.Profile{}, err
	}
	if len(f) != 10 {
		return presence.Profile{}, fmt.Errorf("unexpected checkpoint of %d fields", len(f))
	}
	var n [10]int64
	for _, i := range []int{1, 3, 4, 5, 6, 7, 9} {
		if n[i], err = strconv.ParseInt(f[i], 10, 64); err != nil {
			return presence.Profile{}, err
		}
	}
	return presence.Profile{
		UserID:      f[0],
		Manual:      presence.Manual(n[1]),
		Text:        f[2],
		LastSeen:    n[3],
		PubLastSeen: n[4],
		Version:     uint64(n[5]),
		Settings:    presence.Settings{Status: presence.Visibility(n[6]), LastSeen: presence.Visibility(n[7])},
		PubText:     f[8],
		PubVersion:  uint64(n[9]),
	}, nil
}

// Debug implements tracker.Store; the deadline is the user's s (lua/
// helpers.lua: its bucket's entry in the due set is no later).
func (s *Store) Debug(ctx context.Context, user string) (_ presence.User, _ int64, _ bool, err error) {
	defer callDebug.Start(ctx).Done(&err)
	k := s.shardIndex(user)
	if err := s.refreshBuckets(ctx, []int{k}); err != nil {
		return presence.User{}, 0, false, fmt.Errorf("redisstore: debug: %w", err)
	}
	b, _ := s.bucketOf(user)
	v, err := s.c.Do(ctx, s.c.B().Hget().Key(b).Field(user).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return presence.User{}, 0, false, nil
	}
	if err != nil {
		return presence.User{}, 0, false, fmt.Errorf("redisstore: debug: %w", err)
	}
	var u packedUser
	if err := decodePacked(user, v, &u); err != nil {
		return presence.User{}, 0, false, fmt.Errorf("redisstore: debug: %w", err)
	}
	deadline := u.due
	if deadline == forever {
		deadline = 0
	}
	return u.User, deadline, true, nil
}

// Backend calls timed into presenced_backend_call_duration_seconds.
var (
	callBeatRead      = backendcall.New("redis", "beat")
	callBeatBatch     = backendcall.New("redis", "beat_script")
	callAcquireLease  = backendcall.New("redis", "acquire_lease")
	callRenewLease    = backendcall.New("redis", "renew_lease")
	callTakeLease     = backendcall.New("redis", "take_lease")
	callEndLease      = backendcall.New("redis", "end_lease")
	callTakeOverParts = backendcall.New("redis", "take_over")
	callClaim         = backendcall.New("redis", "claim")
	callTouch         = backendcall.New("redis", "touch")
	callRelease       = backendcall.New("redis", "release")
	callHandOff       = backendcall.New("redis", "hand_off")
	callScanReads     = backendcall.New("redis", "scan_reads")
	callReadPublished = backendcall.New("redis", "read_published")
	callPing          = backendcall.New("redis", "ping")
	callPingPart      = backendcall.New("redis", "ping_part")
	callSetStatus     = backendcall.New("redis", "set_status")
	callBye           = backendcall.New("redis", "bye")
	callDisconnect    = backendcall.New("redis", "disconnect")
	callSetSettings   = backendcall.New("redis", "set_settings")
	callLoad          = backendcall.New("redis", "load")
	callRaiseFloor    = backendcall.New("redis", "raise_floor")
	callCheckFloor    = backendcall.New("redis", "check_floor")
	callCheckLayout   = backendcall.New("redis", "check_layout")
	callGet           = backendcall.New("redis", "get")
	callDebug         = backendcall.New("redis", "debug")
	callExpireParts   = backendcall.New("redis", "expire")
	callDirtyParts    = backendcall.New("redis", "dirty")
	callJoin          = backendcall.New("redis", "join")
	callLeave         = backendcall.New("redis", "leave")
	callRoomPage      = backendcall.New("redis", "room_page")
	callRoomCounts    = backendcall.New("redis", "room_counts")
)
