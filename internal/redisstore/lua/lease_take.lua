-- KEYS: the leases hash. ARGV: lease, the renewal the taker saw, now.
-- Marks a lease that was not renewed since as being taken over
-- ("x:<renewal>:<now>"), so that its owner can renew it no more (and
-- every node can finish the takeover); returns 1 if this call marked
-- it, 0 if it was renewed meanwhile, is gone, or was marked by another
-- node already (renewals list it as taken: every node helps finish).
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return 0 end
if cur == ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1], 'x:' .. ARGV[2] .. ':' .. ARGV[3])
  return 1
end
return 0
