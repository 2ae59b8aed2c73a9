-- Touches are sent in batches (Store.Touch): KEYS per user: the user's
-- bucket, due, dirty; ARGV: now, owner, then per user: user, the number n
-- of its devices listed, and n × (device, last beat, last activity). The
-- owner tells Redis what the devices it holds did since it last said:
-- their last beat, and their activity — FOREVER while a device is active
-- (Redis holds it active and keeps no idle deadline of its own for it),
-- its last activity once that turned idle_after old (the user then turns
-- away, unless a device elsewhere is active). Each user gets {change or {0} or {-1} (not held), the
-- listed devices this owner does not hold}.
--
-- This part runs before the helpers are defined (only packed.lua
-- precedes it): the common touch — of one device, this owner's alone, of
-- a user who is online and stays online by it (or shows a manual status)
-- — only moves the device's times and last_seen: one HGET and one HSET. A
-- read shows a user with an owned device last seen now, but a reader whose
-- clock is behind the owner's would otherwise show it last seen before the
-- beat Redis holds. Anything else stops the fast loop, and that user and
-- the rest go through touch.lua.
local now, own = tonumber(ARGV[1]), tonumber(ARGV[2])
local R = {}
local B, A = 1, 3 -- the user, and its first argument
local function fasttouch(key, id, a, n)
  if n ~= 1 then return false end -- the full path for several devices
  local v
  v, key = hget_user(key, id)
  if not v then return false end
  local u = unpack_user(key, id, v)
  local d = nil
  for _, x in ipairs(u.devs) do
    if x.id == ARGV[a] then d = x end
  end
  if not d or d.own ~= own or d.co or d.cl ~= 0 then return false end
  local la = tonumber(ARGV[a + 2])
  if u.m == 0 and (u.pub ~= 1 or la + IDLE <= now) then return false end
  d.lb = math.max(d.lb, tonumber(ARGV[a + 1]))
  d.la = la
  if d.lb > u.ls then u.ls = d.lb end
  if u.pub ~= 0 then u.pls = u.ls end
  redis.call('HSET', key, id, pack_user(u))
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
