-- A heartbeat is applied in batches: one script call carries the beats
-- that queued while the previous call of their batch group was in flight
-- (Store.Beat), in arrival order. KEYS: per beat, the user's hash, due and
-- dirty set; ARGV: per beat, user, now, device, and a mode: active 1/0,
-- plus 2 when the caller reads the user back (Store.BeatRead: an HTTP
-- heartbeat answers with the user's own view). It returns one reply per
-- beat: {0} (no change), the change, {-1} (not loaded) or {-2} (too many
-- devices) — and for a beat read back, {that reply, the user's read field
-- (read.lua)}: what Store.Get reads of the user after the beat, in the
-- same call.
--
-- This part runs before the helpers are even defined, so a batch of
-- common heartbeats — a device that is alive beating again, the user's
-- public status staying what it is — costs one HMGET, one HSET and one
-- SADD a beat (and the HSET of the read field) and none of the work of loading the whole user. It applies
-- exactly what the full script would: the device's last beat (and last
-- activity) move later, last_seen too (and public last_seen unless the
-- user is invisible), in the hash and the user's read field; no status, text or version changes; the user's due
-- entry stays (a heartbeat only moves deadlines later: the entry fires
-- early and is re-armed, as in memstore). The user's due entry s is never
-- later than any of its deadlines, so s > now means no device is dead and
-- no away is due: there is nothing for settle to do. Anything else — a new
-- or dead device, a device whose connection closed (the beat reopens it),
-- a status the beat would change (an away user becoming active, an idle
-- one whose away is due but not swept yet, a background beat of a user
-- without a manual status), a text not yet published, a due entry that is
-- due — stops the fast loop: the helpers are defined and that beat and the
-- rest go through beat.lua, in order. The differential test against
-- memstore covers both paths, alone and in batches.
local N = #ARGV / 4
local R = {}
local B = 1
local function fastbeat(key, dirty, id, now, dev, act, readback)
  local F = redis.call('HMGET', key, 'd:' .. dev, 'm', 'pub', 't', 'pt', 'ev', 's', 'ls', 'pls', 'v', 'ss', 'sl', 'nd', 'od')
  if not (F[1] and (F[4] or '') == (F[5] or '') and (F[6] or '0') == '0' and tonumber(F[7] or '0') > now) then
    return false
  end
  local c = string.find(F[1], ':', 1, true)
  if string.find(F[1], ':', c + 1, true) then return false end -- closed: beat.lua reopens it
  local lb, la = tonumber(string.sub(F[1], 1, c - 1)), tonumber(string.sub(F[1], c + 1))
  local m, pub = tonumber(F[2] or '0'), tonumber(F[3] or '0')
  local want = -1
  if m == 1 then want = 2 elseif m == 2 then want = 3 elseif m == 3 then want = 0 elseif act then want = 1 end
  if not (now < lb + TTL and want == pub) then return false end
  if now > lb then lb = now end
  if act and now > la then la = now end
  local ls = tonumber(F[8] or '0')
  if now > ls then ls = now end
  local dv, lsx = string.format('%d:%d', lb, la), string.format('%d', ls)
  local pls = F[9] or '0'
  if pub ~= 0 then
    redis.call('HSET', key, 'd:' .. dev, dv, 'ls', lsx, 'pls', lsx)
    pls = lsx
  else
    redis.call('HSET', key, 'd:' .. dev, dv, 'ls', lsx)
  end
  -- The read field, as save writes it (helpers.lua): only its last_seen
  -- and public last_seen moved.
  local rd = read_head(lsx, pls) .. (F[14] or '0') .. ':' .. (F[10] or '0') .. ':' .. (F[2] or '0') .. ':' ..
    (F[3] or '0') .. ':' .. (F[11] or '0') .. ':' .. (F[12] or '0') .. ':' .. (F[13] or '0') .. ':' .. F[7] .. ':' .. (F[4] or '')
  redis.call('HSET', read_key(key), id, rd)
  redis.call('SADD', dirty, id)
  if readback then return {{0}, rd} end
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
