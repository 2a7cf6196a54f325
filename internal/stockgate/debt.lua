-- debt.lua: prepended to the scripts that move units in or out of a loaded
-- SKU from outside the purchase path (finalize, restore, adjust). KEYS[1] is
-- the SKU's meta hash in each of them.
-- The gate's debt is units it admitted that the database no longer has: a
-- decrement made outside the gate (a stock change in the database, a sale by
-- the database fallback) took more than was available. The reservations
-- holding those units will be refused by the database; their give-back pays
-- the debt instead of re-selling units that no longer exist.
-- Every move of units through give or take bumps the meta hash's moves
-- counter: a resync computed from an earlier read of it is refused
-- (resync.lua), since its database snapshot may predate the move.

local function moved()
  redis.call('HINCRBY', KEYS[1], 'moves', 1)
end

-- give(n): n units come back to the gate; the debt is paid first, only the
-- rest becomes available again.
local function give(n)
  if n <= 0 then return end
  moved()
  local debt = tonumber(redis.call('HGET', KEYS[1], 'debt')) or 0
  if debt > 0 then
    local pay = math.min(debt, n)
    redis.call('HINCRBY', KEYS[1], 'debt', -pay)
    n = n - pay
  end
  if n > 0 then redis.call('HINCRBY', KEYS[1], 'avail', n) end
end

-- take(n): n units leave the gate; what is not available becomes debt.
local function take(n)
  if n <= 0 then return end
  moved()
  local avail = redis.call('HINCRBY', KEYS[1], 'avail', -n)
  if avail < 0 then
    redis.call('HSET', KEYS[1], 'avail', 0)
    redis.call('HINCRBY', KEYS[1], 'debt', -avail)
  end
end

