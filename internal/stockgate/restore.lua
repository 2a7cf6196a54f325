-- restore.lua: give released orders' units and buyer slots back (units > 0),
-- or take those of a sale the database fallback made (units < 0), once per
-- order id (the rel set is the token). A release is decided in the database
-- first (the status change is the guard); this is the Redis half, retried
-- until done.
-- KEYS[1] meta  KEYS[2] buyers  KEYS[3] rel
-- ARGV: triples (order_id, user, units)
-- Returns {restored orders, units} or {-2} when the SKU is not loaded (a
-- rebuild will count the release from the database: retry after it).
if redis.call('HEXISTS', KEYS[1], 'epoch') == 0 then
  return {-2, 0}
end
local n, units = 0, 0
for i = 1, #ARGV, 3 do
  if redis.call('SADD', KEYS[3], ARGV[i]) == 1 then
    local qty = tonumber(ARGV[i + 2])
    local avail = redis.call('HINCRBY', KEYS[1], 'avail', qty)
    if avail < 0 then
      -- A direct sale took units Redis had already admitted: those
      -- reservations will be refused by the database and give nothing back.
      redis.call('HSET', KEYS[1], 'avail', 0)
    end
    local left = redis.call('HINCRBY', KEYS[2], ARGV[i + 1], -qty)
    if left <= 0 then redis.call('HDEL', KEYS[2], ARGV[i + 1]) end
    n = n + 1
    units = units + qty
  end
end
return {n, units}
