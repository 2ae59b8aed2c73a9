-- The rules of presence.User (internal/presence/user.go) on a user held
-- packed in its bucket (packed.lua), shared by every operation's script
-- (see lua.go for how a script is put together). Numbers are Lua doubles:
-- exact for times in Unix ms and for versions below 2^53. Every number
-- returned as text is formatted with %d, never Lua's tostring, which
-- would print large ones as 1.7e+15.
--
-- A user, as load returns it: m (manual), t (text), ls (last_seen), pls
-- (public last_seen), v (version), ss, sl (settings), pub, pt (last
-- published status and text), pv (the version everyone else sees: v but
-- while an invisible user's text changed since they vanished), ev
-- (eviction time, 0 = none), s (the user's next deadline as the due set
-- knows it, 0 = none, FOREVER = nothing due: owned devices only) and devs, each device {id, lb (last
-- beat), la (last activity), cl (when its connection closed without a
-- bye, 0 = open), own (the lease of the node that holds its socket, 0 =
-- none: see lease.go), co (other holders, or nil)}. An owned device is
-- alive until its owners release it or their leases are taken over; lb
-- is what an owner last reported, la FOREVER while an owner holds the
-- device active, or its last activity once the owner said it turned idle.
-- Several nodes hold one device when sockets of it are connected to each
-- (a browser tab duplicated with its session storage): the first in own,
-- the others in co; each may end only its own hold (add_holder). The
-- shard's sorted set "due" holds, per bucket, a time no later than the
-- next deadline of any of its users (due_member), the set "dirty" the
-- users changed since the last Dirty. While s is
-- in the future no device has died and no away is due since the user was
-- saved.
--
-- Statuses as presence numbers them: Offline 0, Online 1, Away 2, Busy 3,
-- Invisible 4; manual: None 0, Away 1, Busy 2, Invisible 3.
local MANUAL_STATUS = {[1] = 2, [2] = 3, [3] = 4}

local function fmt(n) return string.format('%d', n) end

-- load reads user id from its bucket key (where the caller's node placed
-- it: hget_user), or returns nil when the user is not held.
local function load(key, id)
  local v, at = hget_user(key, id)
  if not v then return nil end
  return unpack_user(at, id, v)
end

-- save writes u back to its bucket, and leaves the packed user in u.packed
-- (what a heartbeat read back answers: Store.BeatRead).
local rooms -- below: the rooms of the user, written with it

local function save(u)
  u.packed = pack_user(u)
  redis.call('HSET', u.key, u.id, u.packed)
  if u.rdirty then rooms().flush(u) end
  -- Its devices changed and nothing everyone sees did (that would have
  -- a version, and go out as a change): a device note, the user's id on
  -- the shard's channel <tag>devs, for the nodes' read replicas, which
  -- keep full views (Store.Notes). Only while the user shows present:
  -- an offline face shows no devices. pcall: a Redis before 7.0 has no
  -- SPUBLISH, and no node hears notes there (full views read Redis).
  if u.nd0 and #u.devs ~= u.nd0 and u.pub ~= 0 and u.v == u.v0 then
    redis.pcall('SPUBLISH', string.match(u.key, '^(.*)p:%d+$') .. 'devs', u.id)
  end
end

-- device_end is Rules.End: the moment d dies unless it beats again. An
-- owned device never ends here: its owner keeps its deadline.
local function device_end(d)
  if d.own ~= 0 then return FOREVER end
  local e = d.lb + TTL
  if d.cl ~= 0 and d.cl + GRACE < e then e = d.cl + GRACE end
  return e
end

local function alive(d, now) return now < device_end(d) end

local function alive_devices(u, now)
  local n = 0
  for _, d in ipairs(u.devs) do
    if alive(d, now) then n = n + 1 end
  end
  return n
end

-- status is User.Status: the true status at now.
local function status(u, now)
  local any, active = false, 0
  for _, d in ipairs(u.devs) do
    if alive(d, now) then
      any = true
      if d.la > active then active = d.la end
    end
  end
  if not any then return 0 end
  if u.m ~= 0 then return MANUAL_STATUS[u.m] end
  if active > 0 and now < active + IDLE then return 1 end
  return 2
end

-- stamp gives u a new version (above the floor) and returns it.
local function stamp(u)
  local v = u.v + 1
  if v <= FLOOR then v = FLOOR + 1 end
  u.v = v
  return v
end

-- Rooms, the user's side (internal/redisstore/rooms.go). The rooms each
-- device of a user is in are one field of <bucket key>r, named by the
-- user: vis (1, or 0 while the user is invisible), then per device
-- "\2" device, and "\3" room for each of its rooms (ids hold no byte
-- below 0x21). A user counts in a room while vis is 1 and any of its
-- devices is in it; every change of that is an op, appended to the
-- user's outbox (field of <tag>ro: the last op's sequence number, then
-- per op "\2" and seq, room, counted, reason, public status, settings,
-- time joined by "\3") with the marker "\1"..user in the shard's due set
-- (due now, or the claim of the node applying the ops: take). Ops are
-- absolute (counted or not), so applying one twice changes nothing.
-- Reasons as presence.RoomReason numbers them.
--
-- The functions are made on first use (rooms()): most calls of most
-- scripts touch no room, and every function a script defines is made
-- anew on each call.
local R_JOINED, R_LEFT, R_BYE, R_ENDED, R_INVISIBLE, R_VISIBLE = 1, 2, 3, 4, 5, 6
local ROOM_OPS = false
local rooms_cache

rooms = function()
  if rooms_cache then return rooms_cache end
  local L = {}
  local CLAIM, SKEW = 2000, 1000

  function L.tag_of(key) return string.match(key, '^(.*})') end

  -- of returns u's rooms as {vis, devs = {device -> {room -> true}}},
  -- false when it is in none (read once per script).
  function L.of(u)
    if u.rm == nil then
      u.rm = false
      local v = redis.call('HGET', u.key .. 'r', u.id)
      if v then
        local rm = {vis = tonumber(string.sub(v, 1, 1)), devs = {}}
        for entry in string.gmatch(v, '\2([^\2]*)') do
          local set = {}
          for room in string.gmatch(entry, '\3([^\3]*)') do set[room] = true end
          rm.devs[string.match(entry, '^([^\3]*)')] = set
        end
        u.rm = rm
      end
    end
    return u.rm
  end

  -- counts reports whether the user of rm counts in room.
  function L.counts(rm, room)
    if rm.vis ~= 1 then return false end
    for _, set in pairs(rm.devs) do
      if set[room] then return true end
    end
    return false
  end

  -- op records that u now counts in room (counted 1) or not (0).
  function L.op(u, room, counted, reason)
    u.rops = u.rops or {}
    u.rops[#u.rops + 1] = {room, counted, reason}
    u.rdirty = true
  end

  -- drop_device takes device dev of u out of all its rooms: every device
  -- end of every script goes through here (settle, bye, release).
  function L.drop_device(u, dev, reason)
    local rm = L.of(u)
    if not rm or not rm.devs[dev] then return end
    local set = rm.devs[dev]
    rm.devs[dev] = nil
    u.rdirty = true
    for room in pairs(set) do
      if rm.vis == 1 and not L.counts(rm, room) then L.op(u, room, 0, reason) end
    end
  end

  -- visible turns u's membership on or off for its visibility: an
  -- invisible user is a member of no room. Only a change of the manual
  -- status to or from invisible flips it while devices are alive
  -- (set_status.lua): a user with no device alive is in no room.
  function L.visible(u, vis)
    local rm = L.of(u)
    if not rm or rm.vis == vis then return end
    local all = {}
    for _, set in pairs(rm.devs) do
      for room in pairs(set) do all[room] = true end
    end
    rm.vis = vis
    u.rdirty = true
    for room in pairs(all) do
      if vis == 1 then L.op(u, room, 1, R_VISIBLE) else L.op(u, room, 0, R_INVISIBLE) end
    end
  end

  -- flush writes u's rooms and appends its new ops to its outbox, stamped
  -- u.now (save calls it).
  function L.flush(u)
    local now = u.now
    u.rdirty = false
    local rm = u.rm
    local parts, any = {rm and string.format('%d', rm.vis) or '1'}, false
    if rm then
      for dev, set in pairs(rm.devs) do
        local s = {'\2', dev}
        for room in pairs(set) do
          s[#s + 1] = '\3'
          s[#s + 1] = room
        end
        if #s > 2 then
          parts[#parts + 1] = table.concat(s)
          any = true
        end
      end
    end
    if any then
      redis.call('HSET', u.key .. 'r', u.id, table.concat(parts))
    else
      redis.call('HDEL', u.key .. 'r', u.id)
    end
    if not u.rops then return end
    local tag = L.tag_of(u.key)
    local v = redis.call('HGET', tag .. 'ro', u.id) or '0'
    local head = string.match(v, '^(%d+)')
    local seq = tonumber(head)
    local out = {}
    for _, op in ipairs(u.rops) do
      seq = seq + 1
      out[#out + 1] = '\2' .. table.concat({string.format('%d', seq), op[1], op[2], op[3], u.pub, u.ss, u.sl,
        string.format('%d', now)}, '\3')
    end
    u.rops = nil
    redis.call('HSET', tag .. 'ro', u.id, string.format('%d', seq) .. string.sub(v, #head + 1) .. table.concat(out))
    local marker = '\1' .. u.id
    if not redis.call('ZSCORE', tag .. 'due', marker) then
      redis.call('ZADD', tag .. 'due', string.format('%d', now), marker)
    end
    ROOM_OPS = true
    u.rmade = true
  end

  -- take claims the outbox of user id of the shard tag when it is due
  -- (nobody applies it, or its claim lapsed): {1, claim, ops} for the
  -- caller to apply (room_apply.lua) and acknowledge (room_ack.lua)
  -- before the claim, or {0}.
  function L.take(tag, id, now)
    local marker = '\1' .. id
    local due = redis.call('ZSCORE', tag .. 'due', marker)
    if not due or tonumber(due) > now then return {0} end
    local ops = redis.call('HGET', tag .. 'ro', id)
    if not ops then
      redis.call('ZREM', tag .. 'due', marker)
      return {0}
    end
    local claim = now + CLAIM + SKEW
    redis.call('ZADD', tag .. 'due', string.format('%d', claim), marker)
    return {1, string.format('%d', claim), ops}
  end

  L.CLAIM, L.SKEW = CLAIM, SKEW
  rooms_cache = L
  return L
end

-- rooms_mark is the reply r of a script that may have made room ops,
-- with a last element "\1" if it did (Store.change).
local function rooms_mark(r)
  if ROOM_OPS then r[#r + 1] = '\1' end
  return r
end

-- settle is User.settle: drop dead devices, derive the public status and,
-- if it or the text changed, stamp a version and return the change as
-- {1, status, prev, text, public last_seen, version, settings status,
-- settings last_seen, true status, the user's own text}; nil if nothing
-- visible changed. While the user is invisible and shows offline already
-- their public face is frozen (also one never shown: invisible from the
-- start): a text they set changes nothing here (set_status.lua tells the
-- user alone).
local function settle(u, now)
  u.now = now
  local live = {}
  for _, d in ipairs(u.devs) do
    if alive(d, now) then
      live[#live + 1] = d
    else
      rooms().drop_device(u, d.id, R_ENDED)
    end
  end
  u.devs = live
  local st = status(u, now)
  local pub = st
  if pub == 4 then pub = 0 end
  local prev = u.pub
  if pub ~= 0 then
    u.pls = u.ls
  elseif prev ~= 0 and st == 4 then
    u.pls = math.max(u.ls, now)
  elseif prev ~= 0 then
    u.pls = u.ls
  end
  if pub == prev and (u.t == u.pt or u.m == 3) then return nil end
  u.pub = pub
  u.pt = u.t
  local v = stamp(u)
  u.pv = v
  return {1, pub, prev, u.pt, fmt(u.pls), fmt(v), u.ss, u.sl, st, u.t}
end

-- deadline is User.Deadline: the next moment the state may change without
-- input, 0 if none. Owned devices have none here: their owner ends them,
-- and tells Redis when their activity is idle_after old (lease.go).
local function deadline(u, now)
  local nxt, active = 0, 0
  for _, d in ipairs(u.devs) do
    if d.own == 0 then
      local e = device_end(d)
      if nxt == 0 or e < nxt then nxt = e end
      if e > now and d.la > active then active = d.la end
    end
  end
  if u.m == 0 and active > 0 then
    local idle = active + IDLE
    if idle > now and (nxt == 0 or idle < nxt) then nxt = idle end
  end
  return nxt
end

-- due_member is the member of the shard's due set that stands for the
-- bucket key: "\2" and the bucket's number. The due set holds buckets, not
-- users (a user's next deadline is s, in its packed value): a bucket's
-- score is no later than the s of any of its users, and the sweep
-- (expire.lua) looks at the users of a bucket that comes due.
local function due_member(key)
  return '\2' .. string.match(key, 'p:(%d+)$')
end

-- schedule makes sure the user's s, and its bucket's entry in the shard's
-- due set, are no later than its next deadline (or its eviction time when
-- it has no device). As in memstore, a deadline only moves earlier here: a
-- later one is found when the earlier one comes due and is re-armed. The
-- common heartbeat, whose deadline only moves later, does not touch the
-- due set at all.
local function schedule(due, id, u, now)
  local d = deadline(u, now)
  if d == 0 and #u.devs > 0 then
    -- Owned devices only, no away pending: nothing is due here (its
    -- bucket's entry, if any, fires early and finds nothing).
    u.ev = 0
    u.s = FOREVER
    return
  elseif d == 0 then
    if u.ev == 0 then u.ev = now + EVICT end
    d = u.ev
  else
    u.ev = 0
  end
  if d <= now then d = now + 1 end
  if u.s == 0 or d < u.s then
    u.s = d
    redis.call('ZADD', due, 'LT', fmt(d), due_member(u.key))
  end
end

local function find(u, id)
  for _, d in ipairs(u.devs) do
    if d.id == id then return d end
  end
  return nil
end

-- Holders. A device whose sockets several nodes hold (a duplicated
-- browser tab connected to another node) has all of them as owners: the
-- first in d.own, the others in d.co. It lives while any of them holds it;
-- each ends only its own hold (release, hand-off, takeover of its lease),
-- and the device ends by the rules when the last one does. At most MAXCO
-- others are kept (the oldest is forgotten: its later release finds the
-- device lost).
local MAXCO = 7

local function co_index(d, own)
  if d.co then
    for i, x in ipairs(d.co) do
      if x == own then return i end
    end
  end
  return nil
end

-- holds reports whether lease own holds d.
local function holds(d, own)
  return own ~= 0 and (d.own == own or co_index(d, own) ~= nil)
end

-- shared reports whether d has more than one holder.
local function shared(d)
  return d.co ~= nil and #d.co > 0
end

-- add_holder makes lease own a holder of d (its owner if it has none).
local function add_holder(d, own)
  if d.own == 0 then
    d.own, d.co = own, nil
  elseif not holds(d, own) then
    d.co = d.co or {}
    if #d.co >= MAXCO then table.remove(d.co, 1) end
    d.co[#d.co + 1] = own
  end
end

-- drop_holder ends lease own's hold of d, which another lease holds too
-- (shared): the device stays, owned by the others.
local function drop_holder(d, own)
  local i = co_index(d, own)
  if i then
    table.remove(d.co, i)
  elseif d.own == own and d.co then
    d.own = table.remove(d.co, 1)
  end
  if d.co and #d.co == 0 then d.co = nil end
end
