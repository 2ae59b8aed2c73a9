-- KEYS: the user's bucket, due, dirty, the owner's set of buckets in this
-- shard (lease.go).
-- ARGV: user, now, device, owner (a lease), last beat, last activity (the
-- owner's readings, at or before now; activity FOREVER while the device is
-- active — the owner says when it turns idle — or its last activity, 0 if
-- none). A node takes
-- the device whose socket it holds: from then on the device is alive until
-- that node releases it, hands it off, or loses its lease (lease.go), and
-- its beats no longer reach Redis. Applied like a heartbeat, it returns
-- what beat.lua returns ({0}, the change, {-1} not loaded, {-2} too many
-- devices), or {-4} when another owner holds the device since after this
-- owner's last beat of it (the device moved to that node: this claim is
-- stale). A device another owner holds since before this owner's beat is
-- held by both (two sockets of one device on two nodes: a duplicated
-- browser tab): it lives until the last of them ends its hold.
local id, now, dev, own = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local lb, la = tonumber(ARGV[5]), tonumber(ARGV[6])
local u = load(KEYS[1], id)
if not u then return {-1} end
local d = find(u, dev)
if d and d.own ~= 0 and not holds(d, own) and lb < d.lb then return {-4} end
if not d then
  if #u.devs >= MAXDEV and alive_devices(u, now) >= MAXDEV then return {-2} end
  d = {id = dev, lb = 0, la = 0, cl = 0, own = 0}
  u.devs[#u.devs + 1] = d
end
if lb > d.lb then d.lb = lb end
if d.own == 0 then d.cl = 0 end -- owned, cl is a beat apart from its holders (beat.lua)
add_holder(d, own)
if shared(d) then
  if la > d.la then d.la = la end -- active while any holder says so
else
  d.la = la -- the owner's word: FOREVER while the device is active
end
if lb > u.ls then u.ls = lb end
local ch = settle(u, now)
schedule(KEYS[2], id, u, now)
save(u)
redis.call('SADD', KEYS[3], id)
redis.call('SADD', KEYS[4], string.match(u.key, 'p:(%d+)$'))
return ch or {0}
