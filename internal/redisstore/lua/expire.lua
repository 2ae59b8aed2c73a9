-- KEYS: due, dirty. ARGV: now, max, the shard's tag (<prefix>{shard}).
-- Claims the due members of one shard (ZRANGEBYSCORE … LIMIT, removed,
-- applied and re-armed in this one script, so concurrent sweepers never see
-- the same one) and returns up to max changes, each {user, change…}.
-- A member is a bucket ("\2" and its number: helpers.lua's due_member), a
-- user's room ops ("\1" and the user) or, left by a build that kept a
-- member per user, a user.
local now, max, tag = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local out = {}

-- sweep applies what is due to user u at now: it settles it (a change
-- goes to out), then evicts it or re-arms it.
local function sweep(u, id)
  u.s = 0
  local ch = settle(u, now)
  if ch then
    redis.call('SADD', KEYS[2], id)
    ch[1] = id
    out[#out + 1] = ch
  end
  if #u.devs == 0 and u.ev ~= 0 and now >= u.ev then
    if redis.call('SISMEMBER', KEYS[2], id) == 0 then
      redis.call('HDEL', u.key, id)
      redis.call('DECR', tag .. 'c')
      return
    end
    u.ev = now + EVICT -- checkpoint first, then drop
  end
  schedule(KEYS[1], id, u, now)
  save(u)
end

-- sweep_bucket sweeps the users of bucket key whose s is due, and moves
-- the s of the others to their next deadline (a heartbeat moved it later
-- without touching s): the bucket comes due again at the earliest of
-- them, not at each user's stale one.
local function sweep_bucket(key)
  local all = redis.call('HGETALL', key)
  local nxt = nil
  for j = 1, #all, 2 do
    local id = all[j]
    local ok, u = pcall(unpack_user, key, id, all[j + 1])
    if ok and u.s ~= 0 and u.s ~= FOREVER then
      if u.s <= now and #out < max then
        sweep(u, id)
      elseif u.s <= now then
        -- Past max: left due, for the next call.
        if not nxt or u.s < nxt then nxt = u.s end
      else
        if #u.devs > 0 then
          local d = deadline(u, now)
          if d > u.s then
            u.s = d
            redis.call('HSET', key, id, pack_user(u))
          end
        end
        if not nxt or u.s < nxt then nxt = u.s end
      end
    end
  end
  if nxt then redis.call('ZADD', KEYS[1], 'LT', fmt(nxt), due_member(key)) end
end

while #out < max do
  local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', fmt(now), 'LIMIT', 0, max - #out)
  if #due == 0 then break end
  for _, id in ipairs(due) do
    local b = string.byte(id, 1)
    if b == 1 then
      -- A user's room ops nobody applies (helpers.lua's rooms().take): {marker, claim, ops}.
      local t = rooms().take(tag, string.sub(id, 2), now)
      if t[1] == 1 then out[#out + 1] = {id, t[2], t[3]} end
    elseif b == 2 then
      redis.call('ZREM', KEYS[1], id)
      sweep_bucket(tag .. 'p:' .. string.sub(id, 2))
    else
      redis.call('ZREM', KEYS[1], id)
      local u = load(bucket_of(tag, id), id)
      if u then sweep(u, id) end
    end
  end
end
return out
