-- max.lua keeps the larger of a gauge field's value and a sample, for one
-- SKU's second (salehistory.Tally.Sample).
--
-- KEYS[1] the second's hash  <prefix>:{hist:<sku>}:<second>
-- KEYS[2] the seconds' zset  <prefix>:{hist:<sku>}:secs
-- ARGV[1] field (backlog or queue)
-- ARGV[2] the sample
-- ARGV[3] the keys' TTL in seconds
-- ARGV[4] the second (unix)
-- Returns the field's value after.
local v = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local n = tonumber(ARGV[2])
if n > v then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  v = n
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return v
