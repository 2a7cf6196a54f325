-- unqueue.lua: the stream acknowledged these reservations: move each from the
-- outbox to the accepted index, keeping its acceptance time, while it is
-- still in flight (the republisher and the oldest-age gauge read the index).
-- KEYS[1] res  KEYS[2] outbox  KEYS[3] accepted  zset: order_id scored by accepted ms,
--   reservations the stream acknowledged and the database has not decided yet
-- ARGV: order ids
-- Returns the number indexed.
-- One read and one write per key for the whole call (ZMSCORE, HMGET, ZREM,
-- ZADD), in chunks far below Lua's limit on unpacked values: a redis.call
-- costs about a microsecond of Lua-to-Redis conversion, and the relay calls
-- this once per acknowledged batch.
local n = 0
local CHUNK = 500
for from = 1, #ARGV, CHUNK do
  local ids = {unpack(ARGV, from, math.min(from + CHUNK - 1, #ARGV))}
  local scores = redis.call('ZMSCORE', KEYS[2], unpack(ids))
  local queued, index = {}, {}
  for j, id in ipairs(ids) do
    if scores[j] then queued[#queued + 1] = id end
  end
  if #queued > 0 then
    local live = redis.call('HMGET', KEYS[1], unpack(queued))
    redis.call('ZREM', KEYS[2], unpack(queued))
    local k = 1
    for j, id in ipairs(ids) do
      if scores[j] then
        if live[k] then
          index[#index + 1] = scores[j]
          index[#index + 1] = id
        end
        k = k + 1
      end
    end
    if #index > 0 then
      n = n + redis.call('ZADD', KEYS[3], unpack(index))
    end
  end
end
return n
