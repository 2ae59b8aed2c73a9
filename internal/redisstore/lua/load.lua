-- KEYS: the user's bucket (as the caller's node places it: the user goes
-- where its shard places it now), due, the shard's floor. ARGV: user, now,
-- manual, text, last_seen, public last_seen, version, settings status,
-- settings last_seen, public text, public version (0: the profile does
-- not say: text and version). Returns {code, the shard's buckets}: code 1
-- if inserted, 0 if the user was held already, -3 if the shard has no
-- floor: Redis lost its data (restarted empty, or a failover lost the
-- shard), and versions it published may be above what the durable store
-- holds. The caller raises the floor (Store.RaiseFloor) above every
-- version of before and loads again. A user loaded counts on from the
-- floor at least, so nothing it publishes repeats a lost version; its
-- public version keeps its distance below the version
-- (presence.Profile.Raise: a public version above the version counts as
-- the version).

-- split adds a bucket to the shard of tag (linear hashing, packed.lua):
-- bucket p, the next of the round, gives the new bucket p + base the
-- users its hash places there, with their rooms (<bucket>r), the lists of
-- buckets of the leases that hold their devices (lease.go) and an entry
-- in the due set no later than what they have due. One bucket is read and
-- about half of it moved: a split costs about as much as a sweep of a
-- bucket, once per SPLIT_AT users loaded.
local function split(tag, due)
  local n = nbuckets(tag)
  local base = bucket_base(n)
  local p = n - base
  local to = fmt(p + base)
  local from, tokey = tag .. 'p:' .. fmt(p), tag .. 'p:' .. to
  local all = redis.call('HGETALL', from)
  local first = nil
  for j = 1, #all, 2 do
    local id, v = all[j], all[j + 1]
    if math.floor(fnv32a(id) / SHARDS) % (2 * base) ~= p then
      redis.call('HSET', tokey, id, v)
      redis.call('HDEL', from, id)
      local r = redis.call('HGET', from .. 'r', id)
      if r then
        redis.call('HSET', tokey .. 'r', id, r)
        redis.call('HDEL', from .. 'r', id)
      end
      local ok, u = pcall(unpack_user, tokey, id, v)
      if ok then
        for _, d in ipairs(u.devs) do
          if d.own ~= 0 then redis.call('SADD', tag .. 'ob:' .. fmt(d.own), to) end
          for _, x in ipairs(d.co or {}) do redis.call('SADD', tag .. 'ob:' .. fmt(x), to) end
        end
        if u.s ~= 0 and u.s ~= FOREVER and (not first or u.s < first) then first = u.s end
      end
    end
  end
  if first then redis.call('ZADD', due, 'LT', fmt(first), '\2' .. to) end
  redis.call('SET', tag .. 'n', fmt(n + 1))
  NBUCKETS[tag] = n + 1
end

local id, now = ARGV[1], tonumber(ARGV[2])
local tag = tag_of(KEYS[1])
local key = bucket_of(tag, id)
if redis.call('HEXISTS', key, id) == 1 then return {0, nbuckets(tag)} end
local fl = redis.call('GET', KEYS[3])
if not fl then return {-3, nbuckets(tag)} end
local v, pt, pv = tonumber(ARGV[7]), ARGV[4], tonumber(ARGV[7])
if tonumber(ARGV[11]) ~= 0 then pt, pv = ARGV[10], tonumber(ARGV[11]) end
v = math.max(v, pv)
local lag = v - pv
v = math.max(v, tonumber(fl))
local u = {key = key, id = id, m = tonumber(ARGV[3]), t = ARGV[4], ls = tonumber(ARGV[5]),
  pls = tonumber(ARGV[6]), v = v, pv = v - lag, pub = 0, pt = pt, ev = 0,
  s = 0, ss = tonumber(ARGV[8]), sl = tonumber(ARGV[9]), devs = {}}
schedule(KEYS[2], id, u, now)
save(u)
if redis.call('INCR', tag .. 'c') > SPLIT_AT * nbuckets(tag) then split(tag, KEYS[2]) end
return {1, nbuckets(tag)}
