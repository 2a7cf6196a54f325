-- lease.lua: take or renew the room's controller lease, atomically.
-- KEYS[1] lease string   KEYS[2] state hash
-- ARGV[1] owner   ARGV[2] lease TTL (ms)
-- Returns {held: 1 or 0, conv recorded by the last holder ('' none)}
local cur = redis.call('GET', KEYS[1])
local held = 0
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  held = 1
elseif not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  held = 1
end
return {held, redis.call('HGET', KEYS[2], 'conv') or ''}
