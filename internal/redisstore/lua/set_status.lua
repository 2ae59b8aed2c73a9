-- KEYS: the user's bucket, due, dirty. ARGV: user, now, manual, text.
-- User.SetStatus: the change, or — a text changed that nobody else may
-- see (the user is invisible: settle keeps the public face) — {3, ...} as
-- a change, at a version only the user sees.
local id, now = ARGV[1], tonumber(ARGV[2])
local u = load(KEYS[1], id)
if not u then return {-1} end
if now > u.ls and alive_devices(u, now) > 0 then u.ls = now end
local old, oldm = u.t, u.m
u.m = tonumber(ARGV[3])
u.t = ARGV[4]
local ch = settle(u, now)
if (oldm == 3) ~= (u.m == 3) and alive_devices(u, now) > 0 then
  -- To or from invisible: every room of the user sees a leave or a join.
  if u.m == 3 then rooms().visible(u, 0) else rooms().visible(u, 1) end
end
if not ch and u.t ~= old then
  -- A face at version 0 (never shown) would read as the user's own: it
  -- gets a version of its own first (User.SetStatus; a user is loaded at
  -- the floor, so this is epoch 0 only).
  if u.pv == 0 then u.pv = stamp(u) end
  ch = {3, u.pub, u.pub, u.pt, fmt(u.pls), fmt(stamp(u)), u.ss, u.sl, status(u, now), u.t}
end
schedule(KEYS[2], id, u, now)
save(u)
if ch then redis.call('SADD', KEYS[3], id) end
return rooms_mark(ch or {0})
