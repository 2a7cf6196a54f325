-- strike.lua: count one failure of a buyer in a fixed window, and claim the
-- automatic listing when the count reaches the threshold.
-- KEYS[1] the buyer's counter of one kind of failure
-- KEYS[2] the buyer's listing marker (the same hash tag as KEYS[1])
-- ARGV[1] window ms  ARGV[2] threshold (>= 1)  ARGV[3] the listing's TTL ms
-- Returns {count, claimed}: count is the failures in the window so far;
-- claimed is 1 when this call reached the threshold and set the marker (the
-- caller then lists the buyer, and deletes the marker if it cannot), else 0.
-- The counter gets its expiry with its first increment, in the same step:
-- a counter never outlives its window.
local n = redis.call('INCR', KEYS[1])
if n == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
local claimed = 0
if n >= tonumber(ARGV[2]) then
  if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[3]) then
    claimed = 1
  end
end
return {n, claimed}
