-- Follows touch_fast.lua and the helpers in the same script: applies
-- touch B (which failed the fast path; its arguments start at A) and the
-- rest of the batch.
local function touch(key, due, dirty, id, a, n)
  local u = load(key, id)
  local lost = {}
  if not u then
    for j = 0, n - 1 do lost[#lost + 1] = ARGV[a + 3 * j] end
    return {{-1}, lost}
  end
  for j = 0, n - 1 do
    local d = find(u, ARGV[a + 3 * j])
    if d and holds(d, own) then
      local lb, la = tonumber(ARGV[a + 3 * j + 1]), tonumber(ARGV[a + 3 * j + 2])
      if lb > d.lb then d.lb = lb end
      -- Held by several nodes, the device is active while any says so:
      -- one holder turning idle does not make it idle.
      if not shared(d) or la > d.la then d.la = la end
      if lb > u.ls then u.ls = lb end
    else
      lost[#lost + 1] = ARGV[a + 3 * j]
    end
  end
  local ch = settle(u, now)
  schedule(due, id, u, now)
  save(u)
  if ch then redis.call('SADD', dirty, id) end
  return {ch or {0}, lost}
end
local i = B
while A <= #ARGV do
  local id, n = ARGV[A], tonumber(ARGV[A + 1])
  if i > B and fasttouch(KEYS[3 * i - 2], id, A + 2, n) then
    R[i] = {{0}, {}}
  else
    R[i] = touch(KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i], id, A + 2, n)
  end
  i = i + 1
  A = A + 2 + 3 * n
end
return R
