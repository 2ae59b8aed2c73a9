-- KEYS: the user's due set. ARGV: user, now. Claims the user's room ops
-- when nobody applies them (helpers.lua's rooms().take): {1, claim, ops} or
-- {0}.
local R = rooms()
return R.take(R.tag_of(KEYS[1]), ARGV[1], tonumber(ARGV[2]))
