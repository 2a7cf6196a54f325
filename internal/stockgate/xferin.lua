-- xferin.lua: second half of a transfer (see xferout.lua): credit the
-- receiver once per transfer id (the xin set is the token), paying its debt
-- first (debt.lua, run before this script).
-- KEYS[1] receiver meta  KEYS[2] receiver xin (set of credited transfer ids)
-- ARGV[1] transfer id  ARGV[2] units  ARGV[3] the receiver's epoch the donor's entry names
-- Returns 1 credited now, 0 credited before, -2 receiver not loaded (try
-- later), -3 the receiver was loaded again since (a rebuild counted the
-- units from the database): never credit, the donor's entry is refunded.
if redis.call('HEXISTS', KEYS[1], 'epoch') == 0 then
  return -2
end
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[3] then
  return -3
end
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then
  return 0
end
give(tonumber(ARGV[2]))
return 1
