-- Follows beat_fast.lua and the helpers in the same script: applies beat B
-- (which failed the fast path) and the rest of the batch.
local function beat(key, due, dirty, id, now, dev, active, readback)
  local u = load(key, id)
  if not u then return {-1} end
  local d = find(u, dev)
  if not d then
    if #u.devs >= MAXDEV and alive_devices(u, now) >= MAXDEV then return {-2} end
    d = {id = dev, lb = 0, la = 0, cl = 0, own = 0}
    u.devs[#u.devs + 1] = d
  end
  if now > d.lb then d.lb = now end
  if active and now > d.la then d.la = now end
  if d.cl ~= 0 and now > d.cl then d.cl = 0 end
  -- An owned device has no close of its own in Redis (its owner keeps
  -- it): cl then says when it last beat apart from its holders, which
  -- its last holder's release tells from another holder's beat.
  if d.own ~= 0 then d.cl = now end
  if now > u.ls then u.ls = now end
  local ch = settle(u, now)
  schedule(due, id, u, now)
  save(u)
  redis.call('SADD', dirty, id)
  if readback then return {ch or {0}, u.packed} end
  return ch or {0}
end
for i = B, N do
  local key, dirty, id, now, dev = KEYS[3 * i - 2], KEYS[3 * i], ARGV[4 * i - 3], tonumber(ARGV[4 * i - 2]), ARGV[4 * i - 1]
  local act, readback = mode(i)
  R[i] = i > B and fastbeat(key, dirty, id, now, dev, act, readback) or beat(key, KEYS[3 * i - 1], dirty, id, now, dev, act, readback)
end
return R
