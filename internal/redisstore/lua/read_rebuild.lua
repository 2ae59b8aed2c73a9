-- KEYS: user hash. Writes the user's read field (read.lua) from the hash:
-- Store.RebuildReads, for a user a build before the read hash saved.
-- Returns 1, or 0 if the user is not held.
local u = load(KEYS[1])
if not u then return 0 end
u.o.r = nil
save(u)
return 1
