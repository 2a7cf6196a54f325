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
-- The reads and the writes common to every entry are made for the whole
-- call at once (one HMGET, then one HDEL, HSET, ZADD and two ZREMs), in
-- chunks that stay far below Lua's limit on unpacked values: each
-- redis.call costs about a microsecond of Lua-to-Redis conversion, five a
-- reservation before; finalize runs once per order.
local meta = redis.call('HMGET', KEYS[1], 'epoch', 'inflight')
local loaded, counted = meta[1] ~= false, meta[2] ~= false
local applied, units, closed = 0, 0, 0
local CHUNK = 500
local seen = {}
for from = 3, #ARGV, 2 * CHUNK do
  local to = math.min(from + 2 * CHUNK - 1, #ARGV)
  local ids, outcomes = {}, {}
  for i = from, to, 2 do
    -- An id given twice is closed once, by its first outcome, as one
    -- HGET-then-HDEL an id would do.
    if not seen[ARGV[i]] then
      seen[ARGV[i]] = true
      ids[#ids + 1] = ARGV[i]
      outcomes[#ids] = ARGV[i + 1]
    end
  end
  local payloads = #ids > 0 and redis.call('HMGET', KEYS[3], unpack(ids)) or {}
  local gone, marks, scores = {}, {}, {}
  for j, id in ipairs(ids) do
    local payload = payloads[j]
    if payload then
      local outcome = outcomes[j]
      local r = cjson.decode(payload)
      local qty = tonumber(r['quantity']) or 0
      if string.sub(outcome, 1, 1) == 'k' then
        local first = string.sub(outcome, 2)
        outcome = 'f'
        local key = r['idempotency_key']
        if type(key) == 'string' and key ~= '' and first ~= '' then
          -- The key was there (reserve.lua wrote it, and no path is
          -- known that drops it before): were it not, this writes it
          -- without waiting for a live sold-out lease, but stops its
          -- renewals (soldlease.lua).
          if redis.call('HSET', KEYS[5], r['user_id'] .. '\0' .. key, first) == 1 then
            redis.call('HINCRBY', KEYS[1], 'solv', 1)
          end
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
      gone[#gone + 1] = id
      marks[#marks + 1] = '#' .. id
      marks[#marks + 1] = 1
      scores[#scores + 1] = tonumber(r['accepted_at']) or tonumber(ARGV[1])
      scores[#scores + 1] = id
    end
  end
  if #gone > 0 then
    redis.call('HDEL', KEYS[3], unpack(gone))
    redis.call('HSET', KEYS[5], unpack(marks))
    redis.call('ZADD', KEYS[7], unpack(scores))
  end
  -- An id is in the accepted index or in the outbox, never both (unqueue.lua
  -- moves it atomically): removing it from both is removing it from its one.
  if #ids > 0 then
    redis.call('ZREM', KEYS[6], unpack(ids))
    redis.call('ZREM', KEYS[4], unpack(ids))
  end
end
if counted and closed > 0 then redis.call('HINCRBY', KEYS[1], 'inflight', -closed) end
local keep = tonumber(ARGV[2])
if keep > 0 then
  local horizon = tonumber(ARGV[1]) - keep
  local old = redis.call('ZRANGE', KEYS[7], '-inf', '(' .. horizon, 'BYSCORE', 'LIMIT', 0, #ARGV + 16)
  if #old > 0 then
    local marks = {}
    for j, id in ipairs(old) do marks[j] = '#' .. id end
    redis.call('HDEL', KEYS[5], unpack(marks))
    redis.call('ZREM', KEYS[7], unpack(old))
    if horizon > (tonumber(redis.call('HGET', KEYS[1], 'cfloor')) or 0) then
      redis.call('HSET', KEYS[1], 'cfloor', horizon)
    end
  end
end
return {applied, units}
