-- KEYS: the user's due set. ARGV: user, now. Claims the user's room ops
-- when nobody applies them (helpers.lua's room_take): {1, claim, ops} or
-- {0}.
return room_take(tag_of(KEYS[1]), ARGV[1], tonumber(ARGV[2]))
