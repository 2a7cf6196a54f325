-- raise.lua: move the token counter of a SKU up to at least a value (the
-- database's fence), after Redis lost or reset it: tokens below the fence
-- are refused by the database forever.
-- KEYS[1] fence counter
-- ARGV[1] lowest value the counter may have (>= 0)
-- ARGV[2] time to live of the counter, ms (> 0)
-- Returns the counter after the call.
local floor, keep = tonumber(ARGV[1]), tonumber(ARGV[2])
if not floor or floor < 0 or not keep or keep <= 0 then
  return redis.error_reply('ERR raise.lua: bad arguments')
end
local cur = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if cur < floor then
  redis.call('SET', KEYS[1], floor, 'PX', keep)
  return floor
end
return cur
