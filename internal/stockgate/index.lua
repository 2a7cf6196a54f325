-- index.lua: add in-flight reservations that are neither in the outbox nor
-- in the accepted index (re-recorded by a rebuild, or accepted by an older
-- version) to the accepted index, so the republisher sees them too.
-- KEYS[1] res  KEYS[2] outbox  KEYS[3] accepted
-- ARGV: pairs of (order_id, accepted ms) read from the res payloads
-- Returns the number added.
local n = 0
for i = 1, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HEXISTS', KEYS[1], id) == 1 and not redis.call('ZSCORE', KEYS[2], id)
      and redis.call('ZADD', KEYS[3], 'NX', ARGV[i + 1], id) == 1 then
    n = n + 1
  end
end
return n
