-- inflight.lua: read a SKU's in-flight reservations and reserved counter in
-- one atomic step (the first half of a resync or a rebuild).
-- KEYS[1] meta  KEYS[2] res
-- Returns {loaded (0/1), reserved counter, avail - debt, {order_id, json, ...}, epoch, debt, moves}
-- (avail - debt is what the gate may still sell net of units it owes; see restore.lua;
-- moves counts every change of avail or debt other than a reservation, see debt.lua)
local m = redis.call('HMGET', KEYS[1], 'reserved', 'avail', 'epoch', 'debt', 'moves')
local loaded = 0
if m[3] then loaded = 1 end
local debt = tonumber(m[4]) or 0
return {loaded, tonumber(m[1]) or 0, (tonumber(m[2]) or 0) - debt, redis.call('HGETALL', KEYS[2]), m[3] or '', debt,
  tonumber(m[5]) or 0}
