-- KEYS: the user's bucket, due, dirty. ARGV: user, now, owner, then per device:
-- device, last beat, last activity. A node that stops hands the devices
-- it holds back to the rules: each lives its ttl from its last beat, as
-- after missed beats, so its client has that long to reconnect anywhere
-- and a device that does not is expired by any node's sweep. Returns
-- {change or {0}, the listed devices this owner did not hold}.
local id, now, own = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local u = load(KEYS[1], id)
local lost = {}
if not u then return {{0}, lost} end
for i = 4, #ARGV, 3 do
  local d = find(u, ARGV[i])
  if d and holds(d, own) and shared(d) then
    drop_holder(d, own) -- another node holds it too: it stays
    local lb = tonumber(ARGV[i + 1])
    if lb > d.lb then d.lb = lb end
  elseif d and d.own == own then
    local lb, la = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
    if lb > d.lb then d.lb = lb end
    d.la = la
    if lb > u.ls then u.ls = lb end
    d.own = 0
    d.cl = 0
  else
    lost[#lost + 1] = ARGV[i]
  end
end
local ch = settle(u, now)
schedule(KEYS[2], id, u, now)
save(u)
redis.call('SADD', KEYS[3], id)
return {rooms_mark(ch or {0}), lost}
