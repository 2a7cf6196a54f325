-- resync.lua: set a loaded SKU's available units from the database without
-- re-selling units in flight (the second half of a resync).
-- The caller read, atomically, the in-flight set R and the reserved counter C1
-- (inflight.lua), then, in one database snapshot, the stock S and which of R
-- the database has processed. Then:
--   available = S - (units of R not processed) - (units reserved since C1)
-- Units reserved after the snapshot may be counted twice (briefly undersold,
-- never oversold); processed entries of R are closed here, so a late finalize
-- cannot give their units back a second time.
-- KEYS[1] meta  KEYS[2] buyers  KEYS[3] res  KEYS[4] outbox
-- ARGV[1] S  ARGV[2] C1  ARGV[3] units of R not processed
-- ARGV[4] limit  ARGV[5] starts ms  ARGV[6] ends ms
-- ARGV[7..] pairs of (order_id, 'a' applied | 'f' refused) for processed entries of R
-- Returns {avail} or {-2} if the SKU is not loaded.
if redis.call('HEXISTS', KEYS[1], 'epoch') == 0 then
  return {-2}
end
local cnow = tonumber(redis.call('HGET', KEYS[1], 'reserved')) or 0
local avail = tonumber(ARGV[1]) - tonumber(ARGV[3]) - (cnow - tonumber(ARGV[2]))
if avail < 0 then avail = 0 end
for i = 7, #ARGV, 2 do
  local id, outcome = ARGV[i], ARGV[i + 1]
  local payload = redis.call('HGET', KEYS[3], id)
  if payload then
    if outcome == 'f' then
      local r = cjson.decode(payload)
      local left = redis.call('HINCRBY', KEYS[2], r['user_id'], -tonumber(r['quantity']))
      if left <= 0 then redis.call('HDEL', KEYS[2], r['user_id']) end
    end
    redis.call('HDEL', KEYS[3], id)
  end
  redis.call('ZREM', KEYS[4], id)
end
redis.call('HSET', KEYS[1], 'avail', avail, 'limit', ARGV[4], 'starts', ARGV[5], 'ends', ARGV[6])
return {avail}
