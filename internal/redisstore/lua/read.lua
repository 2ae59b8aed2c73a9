-- The shard's read hash, <prefix>{shard}b: one field per user held, named
-- by the user's id, whose value is everything a read needs of the user,
-- "ls:pls:od:" followed by r (see helpers.lua). Every script that changes
-- one of them rewrites it, so a batch read is one HMGET per shard touched
-- (Store.Get) instead of one call per user. Its key shares the user key's
-- {shard} tag: the same slot of a Cluster.
--
-- read_key returns the read hash of the user whose hash is key
-- (<prefix>{shard}u:<id>) and the user's id.
local function read_key(key)
  local b = string.find(key, '}', string.find(key, '{', 1, true), true)
  return string.sub(key, 1, b) .. 'b', string.sub(key, b + 3)
end

-- put_read writes a user's read field; ls, pls and od are decimal strings.
local function put_read(key, ls, pls, od, r)
  local rk, id = read_key(key)
  redis.call('HSET', rk, id, ls .. ':' .. pls .. ':' .. od .. ':' .. r)
end
