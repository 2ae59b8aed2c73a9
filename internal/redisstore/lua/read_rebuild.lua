-- KEYS: user hash. Writes the user's read field (read.lua) from the hash
-- and drops the field it replaced (r): Store.
-- RebuildReads, for a user a build before the read hash saved. Returns 1,
-- or 0 if the user is not held.
local u = load(KEYS[1])
if not u then return 0 end
redis.call('HDEL', KEYS[1], 'r')
save(u)
return 1
