-- KEYS: the user's bucket, due, dirty. ARGV: user, now, settings status, settings
-- last_seen (both empty: keep them). User.SetSettings: the settings
-- replaced and a new version stamped, always (everyone's: the public
-- version too); returns {2, status, prev, text, public last_seen,
-- version, settings status, settings last_seen, true status, the user's
-- own text, settings status before, settings last_seen before}, or {-1}
-- if the user is not held.
local id, now = ARGV[1], tonumber(ARGV[2])
local u = load(KEYS[1], id)
if not u then return {-1} end
local oss, osl = u.ss, u.sl
if ARGV[3] ~= '' then
  u.ss, u.sl = tonumber(ARGV[3]), tonumber(ARGV[4])
end
local st = status(u, now)
local pub = st
if pub == 4 then pub = 0 end
if pub ~= u.pub then st = u.pub end -- a change the next sweep publishes: not yet
local v = stamp(u)
u.pv = v
save(u)
redis.call('SADD', KEYS[3], id)
return {2, u.pub, u.pub, u.pt, fmt(u.pls), fmt(v), u.ss, u.sl, st, u.t, oss, osl}
