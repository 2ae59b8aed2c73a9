-- KEYS: due, dirty. ARGV: now, max, the shard's tag (<prefix>{shard}).
-- Claims the due members of one shard (ZRANGEBYSCORE … LIMIT, removed,
-- applied and re-armed in this one script, so concurrent sweepers never see
-- the same one) and returns up to max changes, each {user, change…}.
local now, max, tag = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local out = {}
while #out < max do
  local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', fmt(now), 'LIMIT', 0, max - #out)
  if #due == 0 then break end
  for _, id in ipairs(due) do
    local u = nil
    if string.byte(id, 1) == 1 then
      -- A user's room ops nobody applies (helpers.lua's rooms().take): {marker, claim, ops}.
      local t = rooms().take(tag, string.sub(id, 2), now)
      if t[1] == 1 then out[#out + 1] = {id, t[2], t[3]} end
    else
      redis.call('ZREM', KEYS[1], id)
      u = load(bucket_of(tag, id), id)
    end
    if u then
      u.s = 0
      local ch = settle(u, now)
      if ch then
        redis.call('SADD', KEYS[2], id)
        ch[1] = id
        out[#out + 1] = ch
      end
      local evict = false
      if #u.devs == 0 and u.ev ~= 0 and now >= u.ev then
        if redis.call('SISMEMBER', KEYS[2], id) == 0 then
          evict = true
        else
          u.ev = now + EVICT -- checkpoint first, then drop
        end
      end
      if evict then
        redis.call('HDEL', u.key, id)
      else
        schedule(KEYS[1], id, u, now)
        save(u)
      end
    end
  end
end
return out
