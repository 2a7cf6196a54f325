-- seed.lua: load a SKU that Redis does not hold (first warm-up, or after Redis lost it).
-- Does nothing if the SKU is already loaded: the caller then resyncs instead.
-- KEYS[1] meta  KEYS[2] buyers
-- ARGV[1] available  ARGV[2] limit  ARGV[3] starts ms  ARGV[4] ends ms  ARGV[5] epoch
-- ARGV[6..] pairs of (user, units held by live orders)
-- Returns 1 if seeded, 0 if it was already loaded.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('DEL', KEYS[2])
for i = 6, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
redis.call('HSET', KEYS[1], 'avail', ARGV[1], 'limit', ARGV[2], 'starts', ARGV[3],
  'ends', ARGV[4], 'epoch', ARGV[5], 'reserved', 0)
return 1
