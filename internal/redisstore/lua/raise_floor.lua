-- KEYS: the shard's floor. ARGV: floor. Raises the floor to ARGV[1]
-- unless it is higher already, and returns it.
local cur = tonumber(redis.call('GET', KEYS[1]) or '-1')
local want = tonumber(ARGV[1])
if want > cur then
  redis.call('SET', KEYS[1], string.format('%d', want))
  return string.format('%d', want)
end
return string.format('%d', cur)
