-- KEYS: the room's members, the versions of its shard's rooms, the
-- shard's room floor. ARGV: room, after ('' for the first page), limit.
-- Returns {count, version, more (1/0), members…}: up to limit members
-- after the member after, in the order of user ids. An empty room reads
-- at its shard's floor: its next version is above it.
local room, after, limit = ARGV[1], ARGV[2], tonumber(ARGV[3])
local n = redis.call('ZCARD', KEYS[1])
local v = tonumber(redis.call('HGET', KEYS[2], room) or '0')
if n == 0 or v == 0 then
  v = math.max(FLOOR, tonumber(redis.call('GET', KEYS[3]) or '0'))
end
local out = {n, string.format('%d', v), 0}
if limit <= 0 or n == 0 then return out end
local min = '-'
if after ~= '' then min = '(' .. after end
local m = redis.call('ZRANGEBYLEX', KEYS[1], min, '+', 'LIMIT', 0, limit + 1)
for i = 1, math.min(#m, limit) do out[#out + 1] = m[i] end
if #m > limit then out[3] = 1 end
return out
