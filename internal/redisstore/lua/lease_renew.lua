-- KEYS: the leases hash (lease → its last renewal, Unix ms, or
-- "x:<renewal>:<ms>" once another node started to take it over at <ms>). ARGV: lease,
-- now. Renews the lease and returns every lease as {lease, value, …};
-- returns -1, and renews nothing, if the lease is gone or being taken
-- over: its owner lost its devices and claims them again under a new
-- lease.
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur or string.sub(cur, 1, 1) == 'x' then return -1 end
if tonumber(ARGV[2]) > tonumber(cur) then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
return redis.call('HGETALL', KEYS[1])
