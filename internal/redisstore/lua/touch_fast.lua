-- Touches are sent in batches (Store.Touch): KEYS per user: the user's
-- hash, due, dirty; ARGV: now, owner, then per user: user, the number n
-- of its devices listed, and n × (device, last beat, last activity). The
-- owner tells Redis what the devices it holds did since it last said:
-- their last beat, and their activity — FOREVER while a device is active
-- (Redis holds it active and keeps no idle deadline of its own for it),
-- its last activity once that turned idle_after old (the user then turns
-- away, unless a device elsewhere is active). Each user gets {change or {0} or {-1} (not held), the
-- listed devices this owner does not hold}.
--
-- This part runs before the helpers are defined: the common touch — of
-- one device, this owner's, of a user who is online and stays online by
-- it (or shows a manual status) — only moves the device's times and
-- last_seen: one HMGET and one HSET, and the same last_seen in the head
-- of the user's read field (read.lua): a read shows a user with an owned
-- device last seen now, but a reader whose clock is behind the owner's
-- would otherwise show it last seen before the beat the hash holds.
-- Anything else stops the fast loop, and that user and the rest go
-- through touch.lua.
local now, own = tonumber(ARGV[1]), tonumber(ARGV[2])
local R = {}
local B, A = 1, 3 -- the user, and its first argument
local OWN = ':0:' .. ARGV[2]
local function fasttouch(key, id, a, n)
  if n ~= 1 then return false end -- the full path for several devices
  local f = 'd:' .. ARGV[a]
  local F = redis.call('HMGET', key, 'pub', 'm', 'ls', f, 'pls')
  if not F[1] or not F[4] then return false end
  -- "last_beat:last_active:0:owner", this owner's
  local v = F[4]
  local c = string.find(v, ':', 1, true)
  local c2 = c and string.find(v, ':', c + 1, true)
  if not c2 or string.sub(v, c2) ~= OWN then return false end
  local lb = math.max(tonumber(string.sub(v, 1, c - 1)), tonumber(ARGV[a + 1]))
  local la = tonumber(ARGV[a + 2])
  local pub = tonumber(F[1])
  if F[2] == '0' and (pub ~= 1 or la + IDLE <= now) then return false end
  local ls = math.max(tonumber(F[3] or '0'), lb)
  local lsx = string.format('%d', ls)
  local plsx = F[5] or '0'
  if pub ~= 0 then
    redis.call('HSET', key, f, string.format('%d:%d', lb, la) .. OWN, 'ls', lsx, 'pls', lsx)
    plsx = lsx
  else
    redis.call('HSET', key, f, string.format('%d:%d', lb, la) .. OWN, 'ls', lsx)
  end
  -- The read field's head "ls:pls:" follows (the rest is unchanged).
  local rk = read_key(key)
  local rd = redis.call('HGET', rk, id)
  if rd then
    local c1 = string.find(rd, ':', 1, true)
    local c2 = c1 and string.find(rd, ':', c1 + 1, true)
    if c2 then redis.call('HSET', rk, id, read_head(lsx, plsx) .. string.sub(rd, c2 + 1)) end
  end
  return true
end
while A <= #ARGV do
  local n = tonumber(ARGV[A + 1])
  if fasttouch(KEYS[3 * B - 2], ARGV[A], A + 2, n) then
    R[B] = {{0}, {}}
    B = B + 1
    A = A + 2 + 3 * n
  else
    break
  end
end
if A > #ARGV then return R end
