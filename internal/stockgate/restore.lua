-- restore.lua: give released orders' units and buyer slots back (units > 0),
-- or take those of a sale the database fallback made (units < 0), once per
-- order id (the rel set is the token). An empty user is a stock change made
-- outside flashsale (captured by the database trigger, order id "ext-<audit
-- id>-<uuid>"): units only, no buyer slot.
-- Taking more than is available records the rest as debt (debt.lua, run
-- before this script). A release is decided in the database
-- first (the status change is the guard); this is the Redis half, retried
-- until done.
-- KEYS[1] meta  KEYS[2] buyers  KEYS[3] rel  KEYS[4] idem
-- ARGV[1] P, then P pairs (user NUL Idempotency-Key, order id): the keys that
--   direct sales (the database fallback's, units < 0 below) made their orders
--   with, recorded in idem so that a retry through the gate of any instance
--   is answered with its order (on every call, also when the units were
--   taken by an earlier one)
-- then triples (order_id, user, units)
-- Returns {restored orders, units}, {-2, 0} when the SKU is not loaded (a
-- rebuild will count the release from the database: retry after it), or
-- {-3, ms} when a key field is new and a sold-out lease is live
-- (leasewait.lua): nothing written but the lease's stop; call again in ms.
-- Every argument is checked before the first write (a Lua error after a
-- write keeps the write: a token spent on a refused call would make the
-- corrected call a no-op): an empty order id, or units that are not a
-- non-zero integer, fail the whole call with nothing written.
local p = tonumber(ARGV[1])
if not p or p < 0 or p ~= math.floor(p) or #ARGV < 1 + 2 * p then
  return redis.error_reply('restore: bad count of key pairs')
end
local t0 = 2 + 2 * p -- the first triple
if (#ARGV - t0 + 1) % 3 ~= 0 then
  return redis.error_reply('restore: arguments must be (order_id, user, units) triples')
end
for i = t0, #ARGV, 3 do
  local qty = tonumber(ARGV[i + 2])
  if ARGV[i] == '' or not qty or qty == 0 or qty ~= math.floor(qty) then
    return redis.error_reply('restore: bad order id or units in triple ' .. ((i - t0 + 3) / 3))
  end
end
if redis.call('HEXISTS', KEYS[1], 'epoch') == 0 then
  return {-2, 0}
end
for j = 1, p do
  if redis.call('HEXISTS', KEYS[4], ARGV[2 * j]) == 0 then
    local wait = lease_wait(KEYS[1])
    if wait > 0 then return {-3, wait} end
    break
  end
end
for j = 1, p do
  redis.call('HSET', KEYS[4], ARGV[2 * j], ARGV[2 * j + 1])
end
local n, units = 0, 0
for i = t0, #ARGV, 3 do
  if redis.call('SADD', KEYS[3], ARGV[i]) == 1 then
    local qty = tonumber(ARGV[i + 2])
    if qty > 0 then give(qty) else take(-qty) end
    if ARGV[i + 1] ~= '' then
      local left = redis.call('HINCRBY', KEYS[2], ARGV[i + 1], -qty)
      if left <= 0 then redis.call('HDEL', KEYS[2], ARGV[i + 1]) end
    end
    n = n + 1
    units = units + qty
  end
end
return {n, units}
