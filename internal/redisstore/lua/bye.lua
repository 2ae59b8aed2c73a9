-- KEYS: the user's bucket, due, dirty. ARGV: user, now, device.
local id, now, dev = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local u = load(KEYS[1], id)
if not u then return {0} end
for i, d in ipairs(u.devs) do
  if d.id == dev then
    if alive(d, now) and now > u.ls then u.ls = now end
    rooms().drop_device(u, dev, R_BYE)
    table.remove(u.devs, i)
    break
  end
end
local ch = settle(u, now)
schedule(KEYS[2], id, u, now)
save(u)
redis.call('SADD', KEYS[3], id)
return rooms_mark(ch or {0})
