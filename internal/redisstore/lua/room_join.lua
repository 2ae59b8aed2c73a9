-- KEYS: the user's bucket, due, dirty. ARGV: user, now, device, room, 1 to
-- join (0 to leave), the cap of rooms per device. Puts the device in the
-- room or takes it out (the user's side: helpers.lua, "Rooms"), then
-- claims the user's ops for the caller to apply: {1, claim, ops}, or {0}
-- when there are none to apply now (nothing changed, or another node
-- holds the claim and applies these after its own). {-3}: the device is
-- not alive; {-4}: it is in as many rooms as it may be.
local id, now, dev, room, join, maxrooms = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5] == '1', tonumber(ARGV[6])
local u = load(KEYS[1], id)
if join then
  local d = u and find(u, dev)
  if not d or not alive(d, now) then return {-3} end
end
if not u then return {0} end
u.now = now
local R = rooms()
local rm = R.of(u)
if not rm then
  if not join then return {0} end
  local vis = 1
  if status(u, now) == 4 then vis = 0 end
  rm = {vis = vis, devs = {}}
  u.rm = rm
end
local set = rm.devs[dev]
if join then
  if set and set[room] then return R.take(R.tag_of(KEYS[1]), id, now) end
  local n = 0
  for _ in pairs(set or {}) do n = n + 1 end
  if n >= maxrooms then return {-4} end
  local before = R.counts(rm, room)
  set = set or {}
  set[room] = true
  rm.devs[dev] = set
  u.rdirty = true
  if not before and R.counts(rm, room) then R.op(u, room, 1, R_JOINED) end
else
  if not set or not set[room] then return R.take(R.tag_of(KEYS[1]), id, now) end
  set[room] = nil
  u.rdirty = true
  if rm.vis == 1 and not R.counts(rm, room) then R.op(u, room, 0, R_LEFT) end
end
R.flush(u)
return R.take(R.tag_of(KEYS[1]), id, now)
