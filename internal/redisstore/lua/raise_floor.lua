-- KEYS: the shard's floor, its read hash. ARGV: floor, the read hash's
-- marker field. Raises the floor to ARGV[1] unless it is higher already,
-- and returns it. A shard without a floor holds nothing written before
-- (it is new, or lost its data): every user it will hold gets its read
-- field from this build's scripts, so the read hash is marked complete
-- (Store.RebuildReads).
local fl = redis.call('GET', KEYS[1])
if not fl then redis.call('HSET', KEYS[2], ARGV[2], '1') end
local cur = tonumber(fl or '-1')
local want = tonumber(ARGV[1])
if want > cur then
  redis.call('SET', KEYS[1], string.format('%d', want))
  return string.format('%d', want)
end
return string.format('%d', cur)
