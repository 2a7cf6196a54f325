-- bucketread.lua: one stock bucket's state for the transfer logic and the
-- sum over buckets (Gate.ReadInFlight, Gate.refill), in one atomic step.
-- KEYS[1] meta  KEYS[2] xfer  KEYS[3] res (only read when ARGV[1] == '1')
-- Returns {loaded, avail, debt, reserved, moves, epoch, buckets, units in
-- transfer out of this bucket, {order_id, json, ...} or {}}
local m = redis.call('HMGET', KEYS[1], 'avail', 'debt', 'reserved', 'moves', 'epoch', 'buckets')
local loaded = 0
if m[5] then loaded = 1 end
local transit = 0
for _, v in ipairs(redis.call('HVALS', KEYS[2])) do
  transit = transit + (tonumber(cjson.decode(v)['units']) or 0)
end
local res = {}
if ARGV[1] == '1' then res = redis.call('HGETALL', KEYS[3]) end
return {loaded, tonumber(m[1]) or 0, tonumber(m[2]) or 0, tonumber(m[3]) or 0, tonumber(m[4]) or 0, m[5] or '',
  m[6] or '1', transit, res}
