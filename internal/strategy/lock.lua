-- lock.lua: take the purchase lock of a SKU and a fencing token for it.
-- KEYS[1] lock     string: owner id of the holder, with a time to live
-- KEYS[2] fence    counter of the tokens handed out
-- ARGV[1] owner id (unique per attempt)
-- ARGV[2] lock time to live, ms (> 0)
-- ARGV[3] time to live of the counter, ms (> 0), renewed by every take
-- Returns the token (>= 1), or 0 when another owner holds the lock.
local ttl, keep = tonumber(ARGV[2]), tonumber(ARGV[3])
if not ttl or ttl <= 0 or not keep or keep <= 0 or ARGV[1] == '' then
  return redis.error_reply('ERR lock.lua: bad arguments')
end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ttl) then
  return 0
end
local token = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], keep)
return token
