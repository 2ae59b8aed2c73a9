-- KEYS: dirty. ARGV: prefix of the shard's user keys. Drains the shard's
-- dirty set and returns each held user's checkpoint as {user, manual, text,
-- last_seen, public last_seen, version, settings status, settings
-- last_seen}.
local ids = redis.call('SMEMBERS', KEYS[1])
if #ids == 0 then return {} end
redis.call('DEL', KEYS[1])
local out = {}
for _, id in ipairs(ids) do
  local f = redis.call('HMGET', ARGV[1] .. id, 'm', 't', 'ls', 'pls', 'v', 'ss', 'sl')
  if f[5] then
    out[#out + 1] = {id, f[1] or '0', f[2] or '', f[3] or '0', f[4] or '0', f[5], f[6] or '0', f[7] or '0'}
  end
end
return out
