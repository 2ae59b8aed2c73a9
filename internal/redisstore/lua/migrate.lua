-- KEYS: a user's hash as builds before the packed layout kept it
-- (<prefix>{shard}u:<id>: fields m, t, ls, pls, v, ss, sl, pub, pt, ev, s
-- and d:<device> = "last_beat:last_active[:closed[:owner[,other…]]]"),
-- the user's bucket. ARGV: user. Packs the user into its bucket (unless
-- the bucket holds it already: what the packed layout wrote wins) and
-- deletes the hash. Returns 1 if it packed the user, 0 if not.
local id = ARGV[1]
local h = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
if #h == 0 or redis.call('HEXISTS', KEYS[2], id) == 1 then return 0 end
local u = {key = KEYS[2], id = id, m = 0, t = '', ls = 0, pls = 0, v = 0, ss = 0, sl = 0,
  pub = 0, pt = '', ev = 0, s = 0, devs = {}}
local TEXT = {t = true, pt = true}
local NUM = {m = true, ls = true, pls = true, v = true, ss = true, sl = true, pub = true, ev = true, s = true}
for i = 1, #h, 2 do
  local f, val = h[i], h[i + 1]
  if string.sub(f, 1, 2) == 'd:' then
    local parts = {}
    for x in string.gmatch(val, '[^:]+') do parts[#parts + 1] = x end
    local d = {id = string.sub(f, 3), lb = tonumber(parts[1]), la = tonumber(parts[2]), cl = tonumber(parts[3] or '0'), own = 0}
    if parts[4] then
      for x in string.gmatch(parts[4], '[^,]+') do
        if d.own == 0 then d.own = tonumber(x) else d.co = d.co or {}; d.co[#d.co + 1] = tonumber(x) end
      end
    end
    u.devs[#u.devs + 1] = d
  elseif TEXT[f] then
    u[f] = val
  elseif NUM[f] then
    u[f] = tonumber(val)
  end
end
u.pv = u.v
save(u)
return 1
