-- stuck.lua: reservations the stream acknowledged that are still in flight
-- since before a bound (the republisher's candidates), oldest first. Index
-- entries whose reservation is closed are dropped on the way.
-- KEYS[1] res  KEYS[2] accepted
-- ARGV[1] bound ms (accepted at or before)  ARGV[2] offset  ARGV[3] limit
-- Returns {order_id, payload, accepted ms, ...}
local ids = redis.call('ZRANGE', KEYS[2], '-inf', ARGV[1], 'BYSCORE', 'LIMIT', ARGV[2], ARGV[3], 'WITHSCORES')
local out = {}
for i = 1, #ids, 2 do
  local payload = redis.call('HGET', KEYS[1], ids[i])
  if payload then
    out[#out + 1] = ids[i]
    out[#out + 1] = payload
    out[#out + 1] = ids[i + 1]
  else
    redis.call('ZREM', KEYS[2], ids[i])
  end
end
return out
