-- adjust.lua: change a loaded SKU's available units by a delta (admin restock
-- or reduction) and its sale settings. A reduction never takes units that are
-- already reserved: it is refused when fewer than -delta are available.
-- KEYS[1] meta  KEYS[2] the SKU's change lock (see Gate.LockSKU)
-- ARGV[1] delta  ARGV[2] limit  ARGV[3] starts ms  ARGV[4] ends ms
-- ARGV[5] the change lock's token the caller holds ('' : no lock checked)
-- Returns {1, avail} done, {0, avail} refused, {-2} not loaded, {-5} the
-- caller's lock expired or was taken over (nothing written).
if ARGV[5] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[5] then
  return {-5}
end
if redis.call('HEXISTS', KEYS[1], 'epoch') == 0 then
  return {-2}
end
local delta = tonumber(ARGV[1])
local avail = tonumber(redis.call('HGET', KEYS[1], 'avail')) or 0
if avail + delta < 0 then
  return {0, avail}
end
-- A restock pays any debt first (debt.lua, run before this script).
if delta > 0 then give(delta) else take(-delta) end
avail = tonumber(redis.call('HGET', KEYS[1], 'avail'))
redis.call('HSET', KEYS[1], 'limit', ARGV[2], 'starts', ARGV[3], 'ends', ARGV[4])
return {1, avail}
