-- unlock.lua: release the purchase lock of a SKU if the caller still holds it
-- (it may have expired and been taken by another owner).
-- KEYS[1] lock
-- ARGV[1] owner id the lock was taken with
-- Returns 1 if released, 0 if the lock was not the caller's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
