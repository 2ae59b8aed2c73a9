-- KEYS: the user's due set. ARGV: user, the claim, the last op applied,
-- now. The caller applied the user's ops up to that one under its claim:
-- they leave the outbox. Ops made meanwhile are claimed again for it and
-- returned as {1, claim, ops}; {0} when none are left, or when the claim
-- is no longer the caller's (it lapsed and another node took the ops: it
-- applies them, again where they were applied already, which changes
-- nothing).
local id, claim, last, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local R = rooms()
local tag = R.tag_of(KEYS[1])
local marker = '\1' .. id
local mine = tonumber(redis.call('ZSCORE', KEYS[1], marker) or '-1') == claim
local v = redis.call('HGET', tag .. 'ro', id)
local rest = {}
if v then
  for op in string.gmatch(v, '\2([^\2]*)') do
    if tonumber(string.match(op, '^(%d+)')) > last then rest[#rest + 1] = '\2' .. op end
  end
end
if #rest == 0 then
  if v then redis.call('HDEL', tag .. 'ro', id) end
  if mine then redis.call('ZREM', KEYS[1], marker) end
  return {0}
end
local ops = string.match(v, '^(%d+)') .. table.concat(rest)
redis.call('HSET', tag .. 'ro', id, ops)
if not mine then return {0} end
claim = now + R.CLAIM + R.SKEW
redis.call('ZADD', KEYS[1], string.format('%d', claim), marker)
return {1, string.format('%d', claim), ops}
