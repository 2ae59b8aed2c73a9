-- KEYS: user hash. ARGV: settings status, settings last_seen. Returns 1,
-- or -1 if the user is not held.
local u = load(KEYS[1])
if not u then return -1 end
u.ss, u.sl = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'ss', ARGV[1], 'sl', ARGV[2])
save(u)
return 1
