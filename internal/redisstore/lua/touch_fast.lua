-- Touches are sent in batches (Store.TouchMany): KEYS per user: the
-- user's hash, due, dirty; ARGV: now, owner, then per user: user, the
-- number n of its devices listed, and n × (device, last beat, last
-- activity). The owner tells Redis what the devices it holds did since it
-- last said (their last beat and activity), about once per idle period of
-- an active user. Each user gets {change or {0} or {-1} (not held), the
-- listed devices this owner does not hold}.
--
-- This part runs before the helpers are defined: the common touch — of a
-- user whose every device is this owner's and listed, who is online and
-- stays online (or shows a manual status), whose text is published —
-- only moves the devices' times, last_seen, and the user's due entry to
-- the new idle time: one HMGET, one HSET and one ZADD. Anything else stops
-- the fast loop, and that user and the rest go through touch.lua.
local now, own = tonumber(ARGV[1]), tonumber(ARGV[2])
local R = {}
local B, A = 1, 3 -- the user, and its first argument
local function fasttouch(key, due, id, a, n)
  local fields = {'r', 'ls', 'pt'}
  for j = 0, n - 1 do fields[#fields + 1] = 'd:' .. ARGV[a + 3 * j] end
  local F = redis.call('HMGET', key, unpack(fields))
  if not F[1] then return false end
  local v, m, pub, ss, sl, nd, s, text = string.match(F[1], '^(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(.*)$')
  if not v or tonumber(nd) ~= n or text ~= (F[3] or '') then return false end
  m, pub, s = tonumber(m), tonumber(pub), tonumber(s)
  local ls, top = tonumber(F[2] or '0'), 0
  local set = {}
  for j = 0, n - 1 do
    local lb0, la0, own0 = string.match(F[4 + j] or '', '^(%d+):(%d+):%d+:(%d+)$')
    if not lb0 or tonumber(own0) ~= own then return false end
    local lb = math.max(tonumber(lb0), tonumber(ARGV[a + 3 * j + 1]))
    local la = math.max(tonumber(la0), tonumber(ARGV[a + 3 * j + 2]))
    if la > top then top = la end
    if lb > ls then ls = lb end
    set[#set + 1] = 'd:' .. ARGV[a + 3 * j]
    set[#set + 1] = string.format('%d:%d:0:%d', lb, la, own)
  end
  local ns = s
  if m == 0 then
    if pub ~= 1 or top + IDLE <= now then return false end
    ns = top + IDLE
  end
  local lsx = string.format('%d', ls)
  set[#set + 1] = 'ls'
  set[#set + 1] = lsx
  if pub ~= 0 then
    set[#set + 1] = 'pls'
    set[#set + 1] = lsx
  end
  if ns ~= s then
    set[#set + 1] = 'r'
    set[#set + 1] = string.format('%s:%d:%d:%s:%s:%s:%d:', v, m, pub, ss, sl, nd, ns) .. text
    redis.call('ZADD', due, string.format('%d', ns), id)
  end
  redis.call('HSET', key, unpack(set))
  return true
end
while A <= #ARGV do
  local n = tonumber(ARGV[A + 1])
  if fasttouch(KEYS[3 * B - 2], KEYS[3 * B - 1], ARGV[A], A + 2, n) then
    R[B] = {{0}, {}}
    B = B + 1
    A = A + 2 + 3 * n
  else
    break
  end
end
if A > #ARGV then return R end
