-- KEYS: the user's bucket, due, dirty.
-- ARGV: user, now, owner, bye (1/0), then per device: device, last beat,
-- last activity. The owner ends devices it holds: their ttl or close
-- grace ran out on the owner (last_seen is then their last beat), or they
-- said bye (last_seen is now). A device another node holds too (a
-- duplicated browser tab) only loses this owner's hold: its other socket
-- lives. Returns {change or {0}, the listed devices this owner did not
-- hold: another node claimed them, and they are left alone}.
local id, now, own, bye = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4] == '1'
local u = load(KEYS[1], id)
local lost = {}
if not u then return {{0}, lost} end
for i = 5, #ARGV, 3 do
  local dev, lb, la = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local at = nil
  for j, d in ipairs(u.devs) do
    if d.id == dev and holds(d, own) then at = j end
  end
  if at and shared(u.devs[at]) then
    local d = u.devs[at]
    drop_holder(d, own)
    if lb > d.lb then d.lb = lb end
  elseif at and not bye and u.devs[at].cl > lb then
    -- It beat since through another path (an HTTP heartbeat of the same
    -- device, beat.lua): it lives by the rules from that beat, owned by
    -- nobody. A later lb from another holder (a duplicated tab's claim
    -- or release) is not such a beat: that holder's hold has ended.
    local d = u.devs[at]
    d.own, d.cl = 0, 0
    if d.la >= FOREVER then d.la = la end
  elseif at then
    local d = u.devs[at]
    if bye then lb = math.max(lb, now) end
    if d.lb > lb then lb = d.lb end -- another holder's later beat (claim.lua)
    if lb > u.ls then u.ls = lb end
    if la > d.la then d.la = la end
    if bye then rooms().drop_device(u, dev, R_BYE) else rooms().drop_device(u, dev, R_ENDED) end
    table.remove(u.devs, at)
  else
    lost[#lost + 1] = dev
  end
end
local ch = settle(u, now)
schedule(KEYS[2], id, u, now)
save(u)
redis.call('SADD', KEYS[3], id)
return {rooms_mark(ch or {0}), lost}
