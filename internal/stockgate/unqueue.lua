-- unqueue.lua: the stream acknowledged these reservations: move each from the
-- outbox to the accepted index, keeping its acceptance time, while it is
-- still in flight (the republisher and the oldest-age gauge read the index).
-- KEYS[1] res  KEYS[2] outbox  KEYS[3] accepted  zset: order_id scored by accepted ms,
--   reservations the stream acknowledged and the database has not decided yet
-- ARGV: order ids
-- Returns the number indexed.
local n = 0
for _, id in ipairs(ARGV) do
  local score = redis.call('ZSCORE', KEYS[2], id)
  if score then
    redis.call('ZREM', KEYS[2], id)
    if redis.call('HEXISTS', KEYS[1], id) == 1 then
      redis.call('ZADD', KEYS[3], score, id)
      n = n + 1
    end
  end
end
return n
