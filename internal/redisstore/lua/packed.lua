-- Users are kept packed: every user held is one field of a bucket hash of
-- its shard, <prefix>{shard}p:<n>, named by the user's id, whose value is
-- the whole user in binary (pack_user below; Go reads it with
-- decodePacked, packed.go). Buckets stay small enough (≤ 128 fields of ≤ 64
-- bytes with Redis's defaults) for Redis to keep each as one listpack, a
-- few bytes of overhead a user instead of a key's ~70, and few enough that
-- their own keys weigh little: a shard starts with BUCKETS buckets and
-- splits one more each time it holds SPLIT_AT users a bucket (load.lua),
-- by linear hashing over g = FNV-1a of the id / SHARDS: with n buckets and
-- base the largest BUCKETS × 2^k ≤ n, a user is in bucket g mod base, or
-- g mod 2 × base when that is below n - base (split already). The shard's
-- count of buckets is <prefix>{shard}n (missing: BUCKETS), of users
-- <prefix>{shard}c. Every key of a shard carries its {shard} tag: one slot
-- of a Cluster.

-- fnv32a is FNV-1a (32 bits) of s, as Go's hash/fnv computes it: the
-- multiplication by 16777619 = 2^24 + 403 is split so that every
-- intermediate stays an exact Lua number (below 2^53).
local function fnv32a(s)
  local h = 2166136261
  for i = 1, #s do
    local lo = h % 256
    h = h - lo + bit.bxor(lo, string.byte(s, i))
    h = ((h % 256) * 16777216 + h * 403) % 4294967296
  end
  return h
end

-- A user is split off into a new bucket of its shard when the shard holds
-- more than SPLIT_AT users a bucket.
local SPLIT_AT = 48

-- nbuckets returns the number of buckets of the shard whose keys start with
-- tag (<prefix>{shard}), read once per call of a script.
local NBUCKETS = {}
local function nbuckets(tag)
  local n = NBUCKETS[tag]
  if not n then
    n = tonumber(redis.call('GET', tag .. 'n') or BUCKETS)
    NBUCKETS[tag] = n
  end
  return n
end

-- bucket_base returns the largest BUCKETS × 2^k not above n.
local function bucket_base(n)
  local base = BUCKETS
  while base * 2 <= n do base = base * 2 end
  return base
end

-- bucket_index returns the bucket of hash g (FNV-1a / SHARDS) among n.
local function bucket_index(g, n)
  local base = bucket_base(n)
  local b = g % base
  if b < n - base then b = g % (2 * base) end
  return b
end

local function tag_of(key) return string.match(key, '^(.*})') end

-- bucket_of returns the key of the bucket of user id in the shard whose
-- keys start with tag.
local function bucket_of(tag, id)
  return tag .. 'p:' .. string.format('%d', bucket_index(math.floor(fnv32a(id) / SHARDS), nbuckets(tag)))
end

-- hget_user returns the packed user id and the key of its bucket, or nil
-- when the user is not held. key is where the caller's node placed the
-- user; when its shard split that bucket since, the user is in the bucket
-- its shard names now.
local function hget_user(key, id)
  local v = redis.call('HGET', key, id)
  if v then return v, key end
  local real = bucket_of(tag_of(key), id)
  if real == key then return nil end
  v = redis.call('HGET', real, id)
  if v then return v, real end
  return nil
end

-- FOREVER is later than any time: the end of an owned device, and s of a
-- user with nothing due.
local FOREVER = 4503599627370496 -- 2^52

-- The packed user, little-endian:
--
--   byte  m | pub<<2 | sk<<5 | ev?<<7     sk: s is 0 (0), FOREVER (1), follows (2),
--                                         or follows as ls + d - 2^23 (3)
--   byte  ss | sl<<2 | pls?<<4 | t?<<5 | pt?<<6 | pv?<<7
--   6     ls                (times: Unix ms, 6 bytes)
--   7     v                 (versions stay below 2^53)
--   6     pls               if pls?: it differs from ls
--   6     s                 if sk = 2
--   3     d                 if sk = 3 (s within 2^23 ms of ls: an HTTP device's deadline)
--   6     ev                if ev?: not 0
--   2+n   t                 if t?: not empty
--   2+n   pt                if pt?: it differs from t
--   7     v - pv            if pv?: the public version is not v (an invisible user's
--                           text changed since they vanished: User's public face)
--   then each device:
--   byte  lk | cl?<<2 | own?<<3 | co<<4 | lb=ls<<7   lk: la is 0 (0), FOREVER (1), follows (2),
--                                                   or is lb (3: an active beat);
--                                                   co: holders after own; lb=ls: lb is the user's ls
--   1+n   id
--   6     lb                unless lb=ls (one device: nearly always)
--   6     la                if lk = 2
--   6     cl                if cl?: not 0
--   6     own               if own?: not 0
--   6×co  the other holders
--
-- An owned user with one device of an 11-byte id (what the gateway
-- assigns), online, takes 35 bytes; one beating over HTTP, active, 31.
-- The fields the rules keep are those of helpers.lua's load.
local function pack_user(u)
  local sk, ds = 0, 0
  if u.s == FOREVER then
    sk = 1
  elseif u.s ~= 0 then
    sk, ds = 2, u.s - u.ls + 8388608
    if ds >= 0 and ds < 16777216 then sk = 3 end
  end
  local f1 = u.m + u.pub * 4 + sk * 32
  if u.ev ~= 0 then f1 = f1 + 128 end
  local f2 = u.ss + u.sl * 4
  local f, a = '', {u.ls, u.v}
  if u.pls ~= u.ls then f2 = f2 + 16; f = f .. 'I6'; a[#a + 1] = u.pls end
  if sk == 2 then f = f .. 'I6'; a[#a + 1] = u.s elseif sk == 3 then f = f .. 'I3'; a[#a + 1] = ds end
  if u.ev ~= 0 then f = f .. 'I6'; a[#a + 1] = u.ev end
  if u.t ~= '' then f2 = f2 + 32; f = f .. 'Hc0'; a[#a + 1] = #u.t; a[#a + 1] = u.t end
  if u.pt ~= u.t then f2 = f2 + 64; f = f .. 'Hc0'; a[#a + 1] = #u.pt; a[#a + 1] = u.pt end
  if u.pv ~= u.v then f2 = f2 + 128; f = f .. 'I7'; a[#a + 1] = u.v - u.pv end
  for _, d in ipairs(u.devs) do
    local lk = 2
    if d.la == 0 then lk = 0 elseif d.la >= FOREVER then lk = 1 elseif d.la == d.lb then lk = 3 end
    local df = lk
    local n = #a
    a[n + 1], a[n + 2], a[n + 3] = 0, #d.id, d.id
    f = f .. 'BBc0'
    if d.lb == u.ls then df = df + 128 else f = f .. 'I6'; a[#a + 1] = d.lb end
    if lk == 2 then f = f .. 'I6'; a[#a + 1] = d.la end
    if d.cl ~= 0 then df = df + 4; f = f .. 'I6'; a[#a + 1] = d.cl end
    if d.own ~= 0 then df = df + 8; f = f .. 'I6'; a[#a + 1] = d.own end
    if d.co then
      df = df + 16 * #d.co
      for _, x in ipairs(d.co) do f = f .. 'I6'; a[#a + 1] = x end
    end
    a[n + 1] = df
  end
  return struct.pack('<BBI6I7' .. f, f1, f2, unpack(a))
end

-- unpack_user returns the user packed in v as a table (helpers.lua's
-- load: key and id are where it lives).
local function unpack_user(key, id, v)
  local f1, f2, ls, ver, p = struct.unpack('<BBI6I7', v)
  local u = {key = key, id = id, m = f1 % 4, pub = math.floor(f1 / 4) % 8, ls = ls, pls = ls, v = ver,
    ss = f2 % 4, sl = math.floor(f2 / 4) % 4, t = '', pt = '', s = 0, ev = 0, devs = {}}
  local sk = math.floor(f1 / 32) % 4
  if math.floor(f2 / 16) % 2 == 1 then u.pls, p = struct.unpack('<I6', v, p) end
  if sk == 1 then
    u.s = FOREVER
  elseif sk == 2 then
    u.s, p = struct.unpack('<I6', v, p)
  elseif sk == 3 then
    local ds
    ds, p = struct.unpack('<I3', v, p)
    u.s = ls + ds - 8388608
  end
  if f1 >= 128 then u.ev, p = struct.unpack('<I6', v, p) end
  if math.floor(f2 / 32) % 2 == 1 then u.t, p = struct.unpack('<Hc0', v, p) end
  u.pt = u.t
  if math.floor(f2 / 64) % 2 == 1 then u.pt, p = struct.unpack('<Hc0', v, p) end
  u.pv = ver
  if f2 >= 128 then
    local lag
    lag, p = struct.unpack('<I7', v, p)
    u.pv = ver - lag
  end
  while p <= #v do
    local df, did
    df, did, p = struct.unpack('<BBc0', v, p)
    local d = {id = did, lb = u.ls, la = 0, cl = 0, own = 0}
    if df >= 128 then df = df - 128 else d.lb, p = struct.unpack('<I6', v, p) end
    local lk = df % 4
    if lk == 1 then d.la = FOREVER elseif lk == 2 then d.la, p = struct.unpack('<I6', v, p) elseif lk == 3 then d.la = d.lb end
    if math.floor(df / 4) % 2 == 1 then d.cl, p = struct.unpack('<I6', v, p) end
    if math.floor(df / 8) % 2 == 1 then d.own, p = struct.unpack('<I6', v, p) end
    local co = math.floor(df / 16)
    if co > 0 then
      d.co = {}
      for j = 1, co do d.co[j], p = struct.unpack('<I6', v, p) end
    end
    u.devs[#u.devs + 1] = d
  end
  u.nd0, u.v0 = #u.devs, ver -- as loaded: save's device note
  return u
end
