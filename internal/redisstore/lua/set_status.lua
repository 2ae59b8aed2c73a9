-- KEYS: the user's bucket, due, dirty. ARGV: user, now, manual, text.
local id, now = ARGV[1], tonumber(ARGV[2])
local u = load(KEYS[1], id)
if not u then return {-1} end
if now > u.ls and alive_devices(u, now) > 0 then u.ls = now end
u.m = tonumber(ARGV[3])
u.t = ARGV[4]
local ch = settle(u, now)
schedule(KEYS[2], id, u, now)
save(u)
if ch then redis.call('SADD', KEYS[3], id) end
return ch or {0}
