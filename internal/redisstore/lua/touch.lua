-- KEYS: user hash, due, dirty. ARGV: user, now, owner, then per device of
-- the user that the owner holds: device, last beat, last activity. The
-- owner tells Redis what its devices did since it claimed them: last_seen
-- and activity move later (an away user who became active shows online
-- again; one who stays active does not turn away at the old activity's
-- idle time). Returns {change or {0} or {-1} (not held), the listed
-- devices that this owner no longer holds}.
local id, now, own = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local u = load(KEYS[1])
local lost = {}
if not u then
  for i = 4, #ARGV, 3 do lost[#lost + 1] = ARGV[i] end
  return {{-1}, lost}
end
for i = 4, #ARGV, 3 do
  local d = find(u, ARGV[i])
  if d and d.own == own then
    local lb, la = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
    if lb > d.lb then d.lb = lb end
    if la > d.la then d.la = la end
    if lb > u.ls then u.ls = lb end
    d.mod = true
  else
    lost[#lost + 1] = ARGV[i]
  end
end
local ch = settle(u, now)
schedule(KEYS[2], id, u, now)
save(u)
redis.call('SADD', KEYS[3], id)
return {ch or {0}, lost}
