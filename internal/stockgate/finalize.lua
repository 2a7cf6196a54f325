-- finalize.lua: close reservations the database has decided, exactly once.
-- The res entry is the token: whoever removes it does the Redis side of the
-- outcome; a second call finds no entry and does nothing.
-- KEYS[1] meta  KEYS[2] buyers  KEYS[3] res  KEYS[4] outbox  KEYS[5] idem (closed ids are
--   remembered there as '#' order_id, so that a late retry of the same order id is not
--   reserved again)
-- KEYS[6] accepted  zset: the accepted index (see unqueue.lua)
-- KEYS[7] closed  zset: the closed markers of idem by the reservation's accepted ms, so
--   they can be dropped after the retention (see below)
-- ARGV[1] now ms  ARGV[2] marker retention ms: markers of reservations accepted
--   before now - retention are dropped (a bounded number per call), and the meta
--   hash's cfloor records that horizon: reserve.lua refuses a reservation accepted
--   before it (its marker may be gone: the caller asks the database)
-- then pairs of (order_id, outcome) where outcome is
--   'a' applied in the database: the units stay sold; forget the reservation
--   'f' refused by the database: give the units (paying any debt first, see
--       debt.lua, run before this script) and the buyer's slot back
--   'k' followed by an order id: refused because its Idempotency-Key had
--       already made that order: as 'f', and the key now names that order
--       (so a retry of the key is answered with the order the database kept)
-- While the SKU is unloaded (fenced for a rebuild, or lost) only the entries
-- are closed: the rebuild computes units and buyers from the database.
-- The meta hash's inflight (units of the res entries, see reserve.lua) is
-- kept exact when present.
-- Returns {closed_applied, compensated_units}
local loaded = redis.call('HEXISTS', KEYS[1], 'epoch') == 1
local counted = redis.call('HEXISTS', KEYS[1], 'inflight') == 1
local applied, units, closed = 0, 0, 0
for i = 3, #ARGV, 2 do
  local id, outcome = ARGV[i], ARGV[i + 1]
  local payload = redis.call('HGET', KEYS[3], id)
  if payload then
    local r = cjson.decode(payload)
    local qty = tonumber(r['quantity']) or 0
    if string.sub(outcome, 1, 1) == 'k' then
      local first = string.sub(outcome, 2)
      outcome = 'f'
      local key = r['idempotency_key']
      if type(key) == 'string' and key ~= '' and first ~= '' then
        redis.call('HSET', KEYS[5], r['user_id'] .. '\0' .. key, first)
      end
    end
    if outcome == 'f' and loaded then
      give(qty)
      local left = redis.call('HINCRBY', KEYS[2], r['user_id'], -qty)
      if left <= 0 then redis.call('HDEL', KEYS[2], r['user_id']) end
      units = units + qty
    else
      applied = applied + 1
    end
    closed = closed + qty
    redis.call('HDEL', KEYS[3], id)
    redis.call('HSET', KEYS[5], '#' .. id, 1)
    redis.call('ZADD', KEYS[7], tonumber(r['accepted_at']) or tonumber(ARGV[1]), id)
  end
  -- An id is in the accepted index or in the outbox, never both (unqueue.lua
  -- moves it atomically).
  if redis.call('ZREM', KEYS[6], id) == 0 then redis.call('ZREM', KEYS[4], id) end
end
if counted and closed > 0 then redis.call('HINCRBY', KEYS[1], 'inflight', -closed) end
local keep = tonumber(ARGV[2])
if keep > 0 then
  local horizon = tonumber(ARGV[1]) - keep
  local old = redis.call('ZRANGE', KEYS[7], '-inf', '(' .. horizon, 'BYSCORE', 'LIMIT', 0, #ARGV + 16)
  if #old > 0 then
    for _, id in ipairs(old) do redis.call('HDEL', KEYS[5], '#' .. id) end
    redis.call('ZREM', KEYS[7], unpack(old))
    if horizon > (tonumber(redis.call('HGET', KEYS[1], 'cfloor')) or 0) then
      redis.call('HSET', KEYS[1], 'cfloor', horizon)
    end
  end
end
return {applied, units}
