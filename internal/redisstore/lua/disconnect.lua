-- KEYS: the user's bucket, due, dirty. ARGV: user, now, device, since. The
-- device's connection closed at now without a bye; its last beat through
-- that connection was at since. Unless it beats again it dies GRACE after
-- now (User.Disconnect); a device that beat after since reconnected and is
-- left alone, as is a device a node holds (its owner keeps its deadline).
local id, now, dev, since = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local u = load(KEYS[1], id)
if not u then return {0} end
local d = find(u, dev)
if d and d.own == 0 and d.lb <= since and d.cl == 0 then
  d.cl = now
end
local ch = settle(u, now)
schedule(KEYS[2], id, u, now)
save(u)
if ch then redis.call('SADD', KEYS[3], id) end
return rooms_mark(ch or {0})
