-- finalize.lua: close reservations the database has decided, exactly once.
-- The res entry is the token: whoever removes it does the Redis side of the
-- outcome; a second call finds no entry and does nothing.
-- KEYS[1] meta  KEYS[2] buyers  KEYS[3] res  KEYS[4] outbox  KEYS[5] idem (closed ids are
--   remembered there, so that a late retry of the same order id is not reserved again)
-- KEYS[6] accepted  zset: the accepted index (see unqueue.lua); optional
-- ARGV: pairs of (order_id, outcome) where outcome is
--   'a' applied in the database: the units stay sold; forget the reservation
--   'f' refused by the database: give the units (paying any debt first, see
--       debt.lua, run before this script) and the buyer's slot back
--   'k' followed by an order id: refused because its Idempotency-Key had
--       already made that order: as 'f', and the key now names that order
--       (so a retry of the key is answered with the order the database kept)
-- While the SKU is unloaded (fenced for a rebuild, or lost) only the entries
-- are closed: the rebuild computes units and buyers from the database.
-- Returns {closed_applied, compensated_units}
local loaded = redis.call('HEXISTS', KEYS[1], 'epoch') == 1
local applied, units = 0, 0
for i = 1, #ARGV, 2 do
  local id, outcome = ARGV[i], ARGV[i + 1]
  local payload = redis.call('HGET', KEYS[3], id)
  if payload then
    local first = nil
    if string.sub(outcome, 1, 1) == 'k' then
      first, outcome = string.sub(outcome, 2), 'f'
      local r = cjson.decode(payload)
      local key = r['idempotency_key']
      if type(key) == 'string' and key ~= '' and first ~= '' then
        redis.call('HSET', KEYS[5], r['user_id'] .. '\0' .. key, first)
      end
    end
    if outcome == 'f' and loaded then
      local r = cjson.decode(payload)
      local qty = tonumber(r['quantity'])
      give(qty)
      local left = redis.call('HINCRBY', KEYS[2], r['user_id'], -qty)
      if left <= 0 then redis.call('HDEL', KEYS[2], r['user_id']) end
      units = units + qty
    else
      applied = applied + 1
    end
    redis.call('HDEL', KEYS[3], id)
    redis.call('HSET', KEYS[5], '#' .. id, 1)
  end
  redis.call('ZREM', KEYS[4], id)
  if KEYS[6] then redis.call('ZREM', KEYS[6], id) end
end
return {applied, units}
