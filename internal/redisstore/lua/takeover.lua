-- KEYS: the owner's set of buckets in this shard, due, dirty. ARGV:
-- owner, its last renewal, now, the shard's tag (<prefix>{shard}), the
-- number k of buckets listed, k bucket numbers, then pairs of user and
-- last_seen (the durable checkpoints the owner wrote before it went
-- silent, newer than what Redis holds). The owner's lease ran out: every
-- device it held in the listed buckets goes back to the rules as if its
-- last beat were the lease's last renewal (the owner vouched for it then),
-- so it dies a ttl later unless it reconnects (a device its owner held
-- active was active then too); departures due already are returned, the
-- others come due like any expiry. The set names every bucket where the
-- owner claimed a device (lease.go); a takeover goes through it a few
-- buckets a call (Store.TakeOverParts), so that no call holds Redis for
-- long. Each bucket is read whole, and only if still in the set, and
-- leaves the set in the same script: its devices are taken over exactly
-- once. Returns the changes as {user, change…}.
local own, lb, now, tag = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local k = tonumber(ARGV[5])
local seen = {}
for i = 6 + k, #ARGV, 2 do seen[ARGV[i]] = tonumber(ARGV[i + 1]) end
local out = {}
for b = 6, 5 + k do
  local n = ARGV[b]
  if redis.call('SREM', KEYS[1], n) == 1 then
    local key = tag .. 'p:' .. n
    local all = redis.call('HGETALL', key)
    for j = 1, #all, 2 do
      local id = all[j]
      local ok, u = pcall(unpack_user, key, id, all[j + 1])
      if not ok then u = {devs = {}} end -- not a packed user: left alone, the others taken over
      local mine = false
      for _, d in ipairs(u.devs) do
        if holds(d, own) and shared(d) then
          drop_holder(d, own) -- another node holds it too: it stays
          mine = true
        elseif d.own == own then
          if lb > d.lb then d.lb = lb end
          if d.la >= FOREVER then d.la = lb end -- active when the lease was last renewed
          d.own = 0
          d.cl = 0
          mine = true
        end
      end
      if mine then
        if seen[id] and seen[id] > u.ls then u.ls = seen[id] end
        local ch = settle(u, now)
        schedule(KEYS[2], id, u, now)
        save(u)
        redis.call('SADD', KEYS[3], id)
        if ch then
          ch[1] = id
          out[#out + 1] = ch
        end
        if u.rmade then
          -- Its devices that ended left their rooms: {marker, claim, ops}.
          local t = rooms().take(tag, id, now)
          if t[1] == 1 then out[#out + 1] = {'\1' .. id, t[2], t[3]} end
        end
      end
    end
  end
end
return out
