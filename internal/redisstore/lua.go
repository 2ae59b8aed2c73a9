package redisstore

import "fmt"

// The scripts apply the rules of presence.User (internal/presence/user.go)
// to a user's hash, one script per operation, each a prelude of constants
// (the store's rules), the shared helpers below and its own body. Numbers
// are Lua doubles: exact for times in Unix ms and for versions below 2^53
// (the design keeps them there). Every number written back is formatted
// with %d, never Lua's tostring, which would print large ones as 1.7e+15.
//
// The hash of a user: m (manual), t (text), ls (last_seen), pls (public
// last_seen), v (version), ss, sl (settings), pub, pt (last published
// status and text), ev (eviction time, 0 = none) and one field d:<device>
// = "last_beat:last_active" per device, s, the time of the user's
// entry in the due set (0 = none), nd, the devices the user had when
// the hash was last saved by a full script (the fast heartbeat adds none),
// and r = "v:m:pub:ss:sl:nd:s:" followed by the text, written by every full
// script. While s is in the future no device has died and no away is due
// since, so a read needs only r, ls and pls (Store.Get). The shard's sorted set "due" holds
// each user's next deadline (member = user id) and the set "dirty" the
// users changed since the last Dirty.

// Statuses as presence numbers them: Offline 0, Online 1, Away 2, Busy 3,
// Invisible 4; manual: None 0, Away 1, Busy 2, Invisible 3.
const luaHelpers = `
local MANUAL_STATUS = {[1] = 2, [2] = 3, [3] = 4}

local function fmt(n) return string.format('%d', n) end

-- The scalar fields of a user's hash; text fields are strings, the others
-- numbers.
local SCALARS = {'m', 't', 'ls', 'pls', 'v', 'pub', 'pt', 'ev', 's', 'nd', 'r'}
local TEXT = {t = true, pt = true, r = true}

-- load reads the hash at key into a table, or nil when the user is not held.
local function load(key)
  local h = redis.call('HGETALL', key)
  if #h == 0 then return nil end
  local u = {key = key, m = 0, t = '', ls = 0, pls = 0, v = 0, ss = 0, sl = 0,
    pub = 0, pt = '', ev = 0, s = 0, nd = -1, r = '', devs = {}, gone = {}}
  for i = 1, #h, 2 do
    local f, val = h[i], h[i + 1]
    if string.sub(f, 1, 2) == 'd:' then
      local c = string.find(val, ':', 1, true)
      u.devs[#u.devs + 1] = {id = string.sub(f, 3), lb = tonumber(string.sub(val, 1, c - 1)),
        la = tonumber(string.sub(val, c + 1))}
    elseif TEXT[f] then
      u[f] = val
    else
      u[f] = tonumber(val)
    end
  end
  u.o = {}
  for _, f in ipairs(SCALARS) do u.o[f] = u[f] end
  return u
end

-- save writes u back: the scalars that changed since load (all of them
-- for a user made without load), the devices marked mod, and the removal
-- of the devices that were dropped.
local function save(u)
  u.nd = #u.devs
  -- r: what a read needs but last_seen, in one field (Store.Get).
  u.r = string.format('%d:%d:%d:%d:%d:%d:%d:', u.v, u.m, u.pub, u.ss, u.sl, u.nd, u.s) .. u.t
  local args = {}
  for _, f in ipairs(SCALARS) do
    local val = u[f]
    if val ~= u.o[f] then
      args[#args + 1] = f
      if TEXT[f] then args[#args + 1] = val else args[#args + 1] = fmt(val) end
    end
  end
  for _, d in ipairs(u.devs) do
    if d.mod then
      args[#args + 1] = 'd:' .. d.id
      args[#args + 1] = fmt(d.lb) .. ':' .. fmt(d.la)
    end
  end
  if #args > 0 then
    redis.call('HSET', u.key, unpack(args))
  end
  if #u.gone > 0 then
    redis.call('HDEL', u.key, unpack(u.gone))
  end
end

local function alive(d, now) return now < d.lb + TTL end

local function alive_devices(u, now)
  local n = 0
  for _, d in ipairs(u.devs) do
    if alive(d, now) then n = n + 1 end
  end
  return n
end

-- status is User.Status: the true status at now.
local function status(u, now)
  local any, active = false, 0
  for _, d in ipairs(u.devs) do
    if alive(d, now) then
      any = true
      if d.la > active then active = d.la end
    end
  end
  if not any then return 0 end
  if u.m ~= 0 then return MANUAL_STATUS[u.m] end
  if active > 0 and now < active + IDLE then return 1 end
  return 2
end

-- settle is User.settle: drop dead devices, derive the public status and,
-- if it or the text changed, stamp a version and return the change as
-- {1, status, prev, text, public last_seen, version, settings status,
-- settings last_seen}; nil if nothing visible changed.
local function settle(u, now)
  local live = {}
  for _, d in ipairs(u.devs) do
    if alive(d, now) then
      live[#live + 1] = d
    else
      u.gone[#u.gone + 1] = 'd:' .. d.id
    end
  end
  u.devs = live
  local st = status(u, now)
  local pub = st
  if pub == 4 then pub = 0 end
  local prev = u.pub
  if pub ~= 0 then
    u.pls = u.ls
  elseif prev ~= 0 and st == 4 then
    u.pls = math.max(u.ls, now)
  elseif prev ~= 0 then
    u.pls = u.ls
  end
  if pub == prev and u.t == u.pt then return nil end
  u.pub = pub
  u.pt = u.t
  local v = u.v + 1
  if v <= FLOOR then v = FLOOR + 1 end
  u.v = v
  return {1, pub, prev, u.t, fmt(u.pls), fmt(v), u.ss, u.sl}
end

-- deadline is User.Deadline: the next moment the state may change without
-- input, 0 if none.
local function deadline(u, now)
  local nxt, active = 0, 0
  for _, d in ipairs(u.devs) do
    local e = d.lb + TTL
    if nxt == 0 or e < nxt then nxt = e end
    if e > now and d.la > active then active = d.la end
  end
  if u.m == 0 and active > 0 then
    local idle = active + IDLE
    if idle > now and idle < nxt then nxt = idle end
  end
  return nxt
end

-- schedule makes sure the shard's due set holds the user no later than its
-- next deadline (or its eviction time when it has no device). As in
-- memstore, a deadline only moves earlier here: a later one is found when
-- the earlier entry comes due and is re-armed. The hash keeps the entry's
-- time in s (0: none), so the common heartbeat, whose deadline only moves
-- later, does not touch the sorted set at all.
local function schedule(due, id, u, now)
  local d = deadline(u, now)
  if d == 0 then
    if u.ev == 0 then u.ev = now + EVICT end
    d = u.ev
  else
    u.ev = 0
  end
  if d <= now then d = now + 1 end
  if u.s == 0 or d < u.s then
    u.s = d
    redis.call('ZADD', due, 'LT', fmt(d), id)
  end
end

local function find(u, id)
  for _, d in ipairs(u.devs) do
    if d.id == id then return d end
  end
  return nil
end
`

// A heartbeat is applied in batches: one script call carries the beats
// that queued while the previous call of their batch group was in flight
// (Store.Beat), in arrival order. KEYS: per beat, the user's hash, due
// and dirty set; ARGV: per beat, user, now, device, active (1/0). It
// returns one reply per beat: {0} (no change), the change, {-1} (not
// loaded) or {-2} (too many devices).
//
// luaBeatFast runs before the helpers are even defined, so a batch of
// common heartbeats — a device that is alive beating again, the user's
// public status staying what it is — costs one HMGET, one HSET and one
// SADD a beat and none of the work of loading the whole user. It applies
// exactly what the full script would: the device's last beat (and last
// activity) move later, last_seen too (and public last_seen unless the
// user is invisible); no status, text or version changes; the user's due
// entry stays (a heartbeat only moves deadlines later: the entry fires
// early and is re-armed, as in memstore). The user's due entry s is never
// later than any of its deadlines, so s > now means no device is dead and
// no away is due: there is nothing for settle to do. Anything else — a new
// or dead device, a status the beat would change (an away user becoming
// active, an idle one whose away is due but not swept yet, a background
// beat of a user without a manual status), a text not yet published, a
// due entry that is due — stops the fast loop: the helpers are defined
// and that beat and the rest go through luaBeat, in order. The
// differential test against memstore covers both paths, alone and in
// batches.
const luaBeatFast = `
local N = #ARGV / 4
local R = {}
local B = 1
local function fastbeat(key, dirty, id, now, dev, act)
  local F = redis.call('HMGET', key, 'd:' .. dev, 'm', 'pub', 't', 'pt', 'ev', 's', 'ls')
  if not (F[1] and (F[4] or '') == (F[5] or '') and (F[6] or '0') == '0' and tonumber(F[7] or '0') > now) then
    return false
  end
  local c = string.find(F[1], ':', 1, true)
  local lb, la = tonumber(string.sub(F[1], 1, c - 1)), tonumber(string.sub(F[1], c + 1))
  local m, pub = tonumber(F[2] or '0'), tonumber(F[3] or '0')
  local want = -1
  if m == 1 then want = 2 elseif m == 2 then want = 3 elseif m == 3 then want = 0 elseif act then want = 1 end
  if not (now < lb + TTL and want == pub) then return false end
  if now > lb then lb = now end
  if act and now > la then la = now end
  local ls = tonumber(F[8] or '0')
  if now > ls then ls = now end
  local dv, lsx = string.format('%d:%d', lb, la), string.format('%d', ls)
  if pub ~= 0 then
    redis.call('HSET', key, 'd:' .. dev, dv, 'ls', lsx, 'pls', lsx)
  else
    redis.call('HSET', key, 'd:' .. dev, dv, 'ls', lsx)
  end
  redis.call('SADD', dirty, id)
  return true
end
while B <= N and fastbeat(KEYS[3 * B - 2], KEYS[3 * B], ARGV[4 * B - 3], tonumber(ARGV[4 * B - 2]), ARGV[4 * B - 1], ARGV[4 * B] == '1') do
  R[B] = {0}
  B = B + 1
end
if B > N then return R end
`

// luaBeat follows luaBeatFast and the helpers in the same script: it
// applies beat B (which failed the fast path) and the rest of the batch.
const luaBeat = `
local function beat(key, due, dirty, id, now, dev, active)
  local u = load(key)
  if not u then return {-1} end
  local d = find(u, dev)
  if not d then
    if #u.devs >= MAXDEV and alive_devices(u, now) >= MAXDEV then return {-2} end
    d = {id = dev, lb = 0, la = 0}
    u.devs[#u.devs + 1] = d
  end
  if now > d.lb then d.lb = now end
  if active and now > d.la then d.la = now end
  d.mod = true
  if now > u.ls then u.ls = now end
  local ch = settle(u, now)
  schedule(due, id, u, now)
  save(u)
  redis.call('SADD', dirty, id)
  return ch or {0}
end
for i = B, N do
  local key, dirty, id, now, dev, act = KEYS[3 * i - 2], KEYS[3 * i], ARGV[4 * i - 3], tonumber(ARGV[4 * i - 2]), ARGV[4 * i - 1], ARGV[4 * i] == '1'
  if i > B and fastbeat(key, dirty, id, now, dev, act) then
    R[i] = {0}
  else
    R[i] = beat(key, KEYS[3 * i - 1], dirty, id, now, dev, act)
  end
end
return R
`

// KEYS: user hash, due, dirty. ARGV: user, now, manual, text.
const luaSetStatus = `
local id, now = ARGV[1], tonumber(ARGV[2])
local u = load(KEYS[1])
if not u then return {-1} end
if now > u.ls and alive_devices(u, now) > 0 then u.ls = now end
u.m = tonumber(ARGV[3])
u.t = ARGV[4]
local ch = settle(u, now)
schedule(KEYS[2], id, u, now)
save(u)
if ch then redis.call('SADD', KEYS[3], id) end
return ch or {0}
`

// KEYS: user hash, due, dirty. ARGV: user, now, device.
const luaBye = `
local id, now, dev = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local u = load(KEYS[1])
if not u then return {0} end
for i, d in ipairs(u.devs) do
  if d.id == dev then
    if alive(d, now) and now > u.ls then u.ls = now end
    table.remove(u.devs, i)
    u.gone[#u.gone + 1] = 'd:' .. dev
    break
  end
end
local ch = settle(u, now)
schedule(KEYS[2], id, u, now)
save(u)
redis.call('SADD', KEYS[3], id)
return ch or {0}
`

// KEYS: user hash. ARGV: settings status, settings last_seen. Returns 1,
// or -1 if the user is not held.
const luaSetSettings = `
local u = load(KEYS[1])
if not u then return -1 end
u.ss, u.sl = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'ss', ARGV[1], 'sl', ARGV[2])
save(u)
return 1
`

// KEYS: user hash, due. ARGV: user, now, manual, text, last_seen,
// public last_seen, version, settings status, settings last_seen.
// Returns 1 if inserted, 0 if the user was held already.
const luaLoad = `
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local id, now = ARGV[1], tonumber(ARGV[2])
local u = {key = KEYS[1], m = tonumber(ARGV[3]), t = ARGV[4], ls = tonumber(ARGV[5]),
  pls = tonumber(ARGV[6]), v = tonumber(ARGV[7]), pub = 0, pt = ARGV[4], ev = 0, s = 0,
  ss = tonumber(ARGV[8]), sl = tonumber(ARGV[9]), devs = {}, gone = {}, o = {}}
schedule(KEYS[2], id, u, now)
save(u)
redis.call('HSET', KEYS[1], 'ss', ARGV[8], 'sl', ARGV[9])
return 1
`

// KEYS: due, dirty. ARGV: now, max, prefix of the shard's user keys.
// Claims the due members of one shard (ZRANGEBYSCORE … LIMIT, removed,
// applied and re-armed in this one script, so concurrent sweepers never
// see the same one) and returns up to max changes, each {user, change…}.
const luaExpire = `
local now, max, kp = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local out = {}
while #out < max do
  local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', fmt(now), 'LIMIT', 0, max - #out)
  if #due == 0 then break end
  for _, id in ipairs(due) do
    redis.call('ZREM', KEYS[1], id)
    local u = load(kp .. id)
    if u then
      u.s = 0
      local ch = settle(u, now)
      if ch then
        redis.call('SADD', KEYS[2], id)
        ch[1] = id
        out[#out + 1] = ch
      end
      local evict = false
      if #u.devs == 0 and u.ev ~= 0 and now >= u.ev then
        if redis.call('SISMEMBER', KEYS[2], id) == 0 then
          evict = true
        else
          u.ev = now + EVICT -- checkpoint first, then drop
        end
      end
      if evict then
        redis.call('DEL', u.key)
      else
        schedule(KEYS[1], id, u, now)
        save(u)
      end
    end
  end
end
return out
`

// KEYS: dirty. ARGV: prefix of the shard's user keys. Drains the shard's
// dirty set and returns each held user's checkpoint as {user, manual, text,
// last_seen, public last_seen, version, settings status, settings
// last_seen}.
const luaDirty = `
local ids = redis.call('SMEMBERS', KEYS[1])
if #ids == 0 then return {} end
redis.call('DEL', KEYS[1])
local out = {}
for _, id in ipairs(ids) do
  local f = redis.call('HMGET', ARGV[1] .. id, 'm', 't', 'ls', 'pls', 'v', 'ss', 'sl')
  if f[5] then
    out[#out + 1] = {id, f[1] or '0', f[2] or '', f[3] or '0', f[4] or '0', f[5], f[6] or '0', f[7] or '0'}
  end
end
return out
`

// script returns the source of one operation's script for the given
// constants: the constants, fast (code that may return before the helpers
// are defined, or ""), the helpers and body.
func script(ttl, idle, maxDevices int64, floor uint64, evict int64, fast, body string) string {
	return fmt.Sprintf("local TTL, IDLE, MAXDEV, FLOOR, EVICT = %d, %d, %d, %d, %d\n", ttl, idle, maxDevices, floor, evict) +
		fast + luaHelpers + body
}
