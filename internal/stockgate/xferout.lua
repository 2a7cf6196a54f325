-- xferout.lua: first half of a transfer of units between two stock buckets
-- of one sale (they live in different hash slots, so no script sees both).
-- Takes up to the wanted units from the donor's avail (never its debt) and
-- records the transfer in the donor's own journal, under its tag, in the
-- same step: the units are never in neither place. xferin.lua credits the
-- receiver (once per transfer id), xferdone.lua then closes the entry;
-- Gate.SweepTransfers finishes a transfer its caller did not.
-- KEYS[1] donor meta  KEYS[2] donor xfer (hash: transfer id -> JSON)
-- ARGV[1] transfer id  ARGV[2] receiver bucket name  ARGV[3] receiver epoch
-- ARGV[4] units wanted  ARGV[5] number of buckets the caller believes  ARGV[6] now ms
-- Returns {units moved, donor avail after} (0 moved: none available),
-- {-2} donor not loaded, {-7} the sale has another number of buckets.
if redis.call('HEXISTS', KEYS[1], 'epoch') == 0 then
  return {-2}
end
local m = redis.call('HMGET', KEYS[1], 'avail', 'buckets', 'epoch')
if (m[2] or '1') ~= ARGV[5] then
  return {-7}
end
local avail = tonumber(m[1]) or 0
local n = math.min(avail, tonumber(ARGV[4]))
if n <= 0 then
  return {0, avail}
end
redis.call('HINCRBY', KEYS[1], 'avail', -n)
redis.call('HINCRBY', KEYS[1], 'moves', 1)
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode({to = ARGV[2], epoch = ARGV[3], units = n, at = tonumber(ARGV[6]), from = m[3]}))
return {n, avail - n}
