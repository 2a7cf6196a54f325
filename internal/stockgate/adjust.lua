-- adjust.lua: change a loaded SKU's available units by a delta (admin restock
-- or reduction) and its sale settings. A reduction never takes units that are
-- already reserved: it is refused when fewer than -delta are available.
-- KEYS[1] meta
-- ARGV[1] delta  ARGV[2] limit  ARGV[3] starts ms  ARGV[4] ends ms
-- Returns {1, avail} done, {0, avail} refused, {-2} not loaded.
if redis.call('HEXISTS', KEYS[1], 'epoch') == 0 then
  return {-2}
end
local delta = tonumber(ARGV[1])
local avail = tonumber(redis.call('HGET', KEYS[1], 'avail')) or 0
if avail + delta < 0 then
  return {0, avail}
end
if delta > 0 then
  -- A restock pays any debt first (see restore.lua).
  local debt = tonumber(redis.call('HGET', KEYS[1], 'debt')) or 0
  local pay = math.min(debt, delta)
  if pay > 0 then redis.call('HINCRBY', KEYS[1], 'debt', -pay) end
  delta = delta - pay
end
avail = redis.call('HINCRBY', KEYS[1], 'avail', delta)
redis.call('HSET', KEYS[1], 'limit', ARGV[2], 'starts', ARGV[3], 'ends', ARGV[4])
return {1, avail}
