-- KEYS: user hash, due. ARGV: user, now, manual, text, last_seen, public
-- last_seen, version, settings status, settings last_seen. Returns 1 if
-- inserted, 0 if the user was held already.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local id, now = ARGV[1], tonumber(ARGV[2])
local u = {key = KEYS[1], m = tonumber(ARGV[3]), t = ARGV[4], ls = tonumber(ARGV[5]),
  pls = tonumber(ARGV[6]), v = tonumber(ARGV[7]), pub = 0, pt = ARGV[4], ev = 0, s = 0,
  ss = tonumber(ARGV[8]), sl = tonumber(ARGV[9]), devs = {}, gone = {}, o = {}}
schedule(KEYS[2], id, u, now)
save(u)
redis.call('HSET', KEYS[1], 'ss', ARGV[8], 'sl', ARGV[9])
return 1
