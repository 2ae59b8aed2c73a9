-- KEYS: dirty. ARGV: the shard's tag (<prefix>{shard}). Drains the
-- shard's dirty set and returns each held user's checkpoint as {user,
-- manual, text, last_seen, public last_seen, version, settings status,
-- settings last_seen, public text, public version}.
local ids = redis.call('SMEMBERS', KEYS[1])
if #ids == 0 then return {} end
redis.call('DEL', KEYS[1])
local out = {}
for _, id in ipairs(ids) do
  local u = load(bucket_of(ARGV[1], id), id)
  if u then
    out[#out + 1] = {id, fmt(u.m), u.t, fmt(u.ls), fmt(u.pls), fmt(u.v), fmt(u.ss), fmt(u.sl), u.pt, fmt(u.pv)}
  end
end
return out
