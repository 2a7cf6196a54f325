-- oldest.lua: the acceptance time of the SKU's oldest reservation in flight
-- (the outbox's or the accepted index's first entry), dropping up to 100
-- index entries whose reservation is already closed.
-- KEYS[1] res  KEYS[2] outbox  KEYS[3] accepted
-- Returns accepted ms, or -1 when nothing is in flight.
local oldest = -1
local o = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if o[2] then oldest = tonumber(o[2]) end
for _ = 1, 100 do
  local a = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if not a[1] then break end
  if redis.call('HEXISTS', KEYS[1], a[1]) == 1 then
    local s = tonumber(a[2])
    if oldest < 0 or s < oldest then oldest = s end
    break
  end
  redis.call('ZREM', KEYS[3], a[1])
end
return oldest
