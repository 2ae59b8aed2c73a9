-- A heartbeat is applied in batches: one script call carries the beats
-- that queued while the previous call of their batch group was in flight
-- (Store.Beat), in arrival order. KEYS: per beat, the user's bucket, due
-- and dirty set; ARGV: per beat, user, now, device, and a mode: active 1/0,
-- plus 2 when the caller reads the user back (Store.BeatRead: an HTTP
-- heartbeat answers with the user's own view). It returns one reply per
-- beat: {0} (no change), the change, {-1} (not loaded) or {-2} (too many
-- devices) — and for a beat read back, {that reply, the packed user
-- (packed.lua)}: what Store.Get reads of the user after the beat, in the
-- same call.
--
-- This part runs before the helpers are even defined (only packed.lua
-- precedes it), so a batch of common heartbeats — a device that is alive
-- beating again, the user's public status staying what it is — costs one
-- HGET, one HSET and one SADD a beat and none of the rules' work. It
-- applies exactly what the full script would: the device's last beat (and
-- last activity) move later, last_seen too (and public last_seen unless
-- the user is invisible); no status, text or version changes; the user's
-- next deadline s and its bucket's due member stay (a heartbeat only moves
-- deadlines later: the member fires early and the sweep re-arms s, as
-- memstore does its entry). s is never later than any of the user's
-- deadlines, so s > now means no device is dead and no away is due: there
-- is nothing for settle to do. Anything else — a new
-- or dead device, a device whose connection closed (the beat reopens it)
-- or that a node holds, a status the beat would change (an away user
-- becoming active, an idle one whose away is due but not swept yet, a
-- background beat of a user without a manual status), a text not yet
-- published, an eviction pending, a due entry that is due — stops the fast
-- loop: the helpers are defined and that beat and the rest go through
-- beat.lua, in order. The differential test against memstore covers both
-- paths, alone and in batches.
local N = #ARGV / 4
local R = {}
local B = 1
local function fastbeat(key, dirty, id, now, dev, act, readback)
  local v
  v, key = hget_user(key, id)
  if not v then return false end
  local u = unpack_user(key, id, v)
  if not ((u.t == u.pt or u.m == 3) and u.ev == 0 and u.s > now) then return false end
  local d = nil
  for _, x in ipairs(u.devs) do
    if x.id == dev then d = x end
  end
  if not d or d.cl ~= 0 or d.own ~= 0 then return false end
  local want = -1
  if u.m == 1 then want = 2 elseif u.m == 2 then want = 3 elseif u.m == 3 then want = 0 elseif act then want = 1 end
  if not (now < d.lb + TTL and want == u.pub) then return false end
  if now > d.lb then d.lb = now end
  if act and now > d.la then d.la = now end
  if now > u.ls then u.ls = now end
  if u.pub ~= 0 then u.pls = u.ls end
  v = pack_user(u)
  redis.call('HSET', key, id, v)
  redis.call('SADD', dirty, id)
  if readback then return {{0}, v} end
  return {0}
end
-- mode: active (1/0) + 2 when the caller reads the user back.
local function mode(i)
  local m = tonumber(ARGV[4 * i])
  return m % 2 == 1, m >= 2
end
while B <= N do
  local act, readback = mode(B)
  local r = fastbeat(KEYS[3 * B - 2], KEYS[3 * B], ARGV[4 * B - 3], tonumber(ARGV[4 * B - 2]), ARGV[4 * B - 1], act, readback)
  if not r then break end
  R[B] = r
  B = B + 1
end
if B > N then return R end
