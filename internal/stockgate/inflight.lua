-- inflight.lua: read the in-flight reservations and the reserved counter in one
-- atomic step (the first half of a resync).
-- KEYS[1] meta  KEYS[2] res
-- Returns {loaded (0/1), reserved counter, avail, {order_id, json, ...}}
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0, 0, 0, {}}
end
local m = redis.call('HMGET', KEYS[1], 'reserved', 'avail')
return {1, tonumber(m[1]) or 0, tonumber(m[2]) or 0, redis.call('HGETALL', KEYS[2])}
