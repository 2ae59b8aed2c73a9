-- KEYS: the room's members (a sorted set, every score 0: pages in the
-- order of user ids), the versions of its shard's rooms (a hash), the
-- shard's room floor. ARGV: now, the claim's end, room, user, counted (1
-- or 0). Applies one op of a user's outbox (helpers.lua, "Rooms") unless
-- the claim it was taken under has ended: {-1}. {0} if the user counted
-- as the op says already (an op applied twice, or one another op of the
-- same batch made so); else {1, count, version}: the user joined or left.
-- A room's versions grow from its shard's floor, which an emptied room
-- raises to its last version, so a room made again never repeats one.
local now, fence, room, user = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
if now > fence then return {-1} end
local changed
if ARGV[5] == '1' then
  changed = redis.call('ZADD', KEYS[1], 0, user) == 1
else
  changed = redis.call('ZREM', KEYS[1], user) == 1
end
if not changed then return {0} end
local v = tonumber(redis.call('HGET', KEYS[2], room) or '0')
local floor = tonumber(redis.call('GET', KEYS[3]) or '0')
if v < FLOOR then v = FLOOR end
if v < floor then v = floor end
v = v + 1
local n = redis.call('ZCARD', KEYS[1])
if n == 0 then
  redis.call('HDEL', KEYS[2], room)
  redis.call('SET', KEYS[3], string.format('%d', v))
else
  redis.call('HSET', KEYS[2], room, string.format('%d', v))
end
return {1, n, string.format('%d', v)}
