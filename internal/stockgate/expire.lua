-- expire.lua: drop a finished sale's keys once nothing is in flight, so Redis
-- does not hold ended sales forever. Never drops keys while a reservation is
-- in the outbox or not yet applied.
-- KEYS[1] meta  KEYS[2] buyers  KEYS[3] res  KEYS[4] outbox  KEYS[5] idem  KEYS[6] rel
-- KEYS[7] accepted (the accepted index, see unqueue.lua; only closed entries are left in it here)
-- KEYS[8] closed (the closed markers' index, see finalize.lua)
-- ARGV[1] now ms  ARGV[2] retention ms
-- Returns 1 dropped, 0 kept (not ended long enough, or work in flight), -2 not loaded.
if redis.call('HEXISTS', KEYS[1], 'epoch') == 0 then
  return -2
end
local ends = tonumber(redis.call('HGET', KEYS[1], 'ends')) or 0
if ends <= 0 or tonumber(ARGV[1]) < ends + tonumber(ARGV[2]) then
  return 0
end
if redis.call('HLEN', KEYS[3]) > 0 or redis.call('ZCARD', KEYS[4]) > 0 then
  return 0
end
-- UNLINK: large hashes are freed in the background, not in this call.
redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
return 1
