-- bucketcheck.lua: put in front of reserve.lua. The caller appends the
-- number of stock buckets it believes the sale has as the last argument;
-- it is removed here, so reserve.lua sees its own arguments unchanged.
-- A bucket seeded for another number (the sale was re-split and the
-- caller's catalog is stale) is refused with {-8}, nothing written: a
-- buyer must always buy from the home bucket the current split gives them.
-- An unloaded bucket is left to reserve.lua ({-2}: the caller loads it).
local want = table.remove(ARGV)
if redis.call('HEXISTS', KEYS[1], 'epoch') == 1 and (redis.call('HGET', KEYS[1], 'buckets') or '1') ~= want then
  return {-8}
end
