-- The shard's read hash, <prefix>{shard}b: one field per user held, named
-- by the user's id, whose value is everything a read needs of the user:
-- "ls:pls:od:" followed by r = "v:m:pub:ss:sl:nd:s:" and the text (see
-- helpers.lua; pls is empty when it equals ls, as it does for a user
-- online). Every full script rewrites it when it saves the user, and the
-- fast heartbeat and the fast touch when they move last_seen, so a batch read is one HMGET per shard touched
-- (Store.Get) instead of one call per user. Its key shares the user key's
-- {shard} tag: the same slot of a Cluster.
--
-- read_key returns the read hash of the user whose hash is key
-- (<prefix>{shard}u:<id>) and the user's id.
local function read_key(key)
  local b = string.find(key, '}', string.find(key, '{', 1, true), true)
  return string.sub(key, 1, b) .. 'b', string.sub(key, b + 3)
end

-- read_head is the start of a read field, "ls:pls:", from ls and pls as
-- decimal strings.
local function read_head(ls, pls)
  if pls == ls then return ls .. '::' end
  return ls .. ':' .. pls .. ':'
end
