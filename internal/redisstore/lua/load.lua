-- KEYS: the user's bucket, due, the shard's floor. ARGV: user, now,
-- manual, text, last_seen, public last_seen, version, settings status,
-- settings last_seen, public text, public version (0: the profile does
-- not say: text and version). Returns 1 if inserted, 0 if the user was held
-- already, -3 if the shard has no floor: Redis lost its data (restarted
-- empty, or a failover lost the shard), and versions it published may be
-- above what the durable store holds. The caller raises the floor
-- (Store.RaiseFloor) above every version of before and loads again. A
-- user loaded counts on from the floor at least, so nothing it publishes
-- repeats a lost version; its public version keeps its distance below
-- the version (presence.Profile.Raise: a public version above the version
-- counts as the version).
local id, now = ARGV[1], tonumber(ARGV[2])
if redis.call('HEXISTS', KEYS[1], id) == 1 then return 0 end
local fl = redis.call('GET', KEYS[3])
if not fl then return -3 end
local v, pt, pv = tonumber(ARGV[7]), ARGV[4], tonumber(ARGV[7])
if tonumber(ARGV[11]) ~= 0 then pt, pv = ARGV[10], tonumber(ARGV[11]) end
v = math.max(v, pv)
local lag = v - pv
v = math.max(v, tonumber(fl))
local u = {key = KEYS[1], id = id, m = tonumber(ARGV[3]), t = ARGV[4], ls = tonumber(ARGV[5]),
  pls = tonumber(ARGV[6]), v = v, pv = v - lag, pub = 0, pt = pt, ev = 0,
  s = 0, ss = tonumber(ARGV[8]), sl = tonumber(ARGV[9]), devs = {}}
schedule(KEYS[2], id, u, now)
save(u)
return 1
