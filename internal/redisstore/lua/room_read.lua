-- KEYS: the room's members, the versions of its shard's rooms (and the
-- shard's room floor, which a read does not need: the room's scripts
-- take one set of keys). ARGV: room, after ('' for the first page), limit.
-- Returns {count, version, more (1/0), members…}: up to limit members
-- after the member after, in the order of user ids. An empty room is no
-- room: it reads at version 0, as on the embedded node (its next version
-- is above every one it had: room_apply.lua).
local room, after, limit = ARGV[1], ARGV[2], tonumber(ARGV[3])
local n = redis.call('ZCARD', KEYS[1])
local v = 0
if n > 0 then v = tonumber(redis.call('HGET', KEYS[2], room) or '0') end
local out = {n, string.format('%d', v), 0}
if limit <= 0 or n == 0 then return out end
local min = '-'
if after ~= '' then min = '(' .. after end
local m = redis.call('ZRANGEBYLEX', KEYS[1], min, '+', 'LIMIT', 0, limit + 1)
for i = 1, math.min(#m, limit) do out[#out + 1] = m[i] end
if #m > limit then out[3] = 1 end
return out
