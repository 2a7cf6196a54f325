-- inflight.lua: read a SKU's in-flight reservations and reserved counter in
-- one atomic step (the first half of a resync or a rebuild).
-- KEYS[1] meta  KEYS[2] res
-- Returns {loaded (0/1), reserved counter, avail, {order_id, json, ...}, epoch}
local m = redis.call('HMGET', KEYS[1], 'reserved', 'avail', 'epoch')
local loaded = 0
if m[3] then loaded = 1 end
return {loaded, tonumber(m[1]) or 0, tonumber(m[2]) or 0, redis.call('HGETALL', KEYS[2]), m[3] or ''}
