-- reserve.lua: admit one purchase atomically, rate limits included. Every
-- check (arguments, rate limits, duplicates, window, stock, per-user limit)
-- is read-only and comes before the first write (a Lua error after a write
-- keeps the write). A request a rate limit refuses writes nothing at all.
-- KEYS[1] meta    hash: avail, limit, starts, ends (ms, 0 = none), reserved, epoch,
--                 inflight (units of the res entries, kept when present: see seed.lua),
--                 cfloor (closed markers of reservations accepted before it are dropped,
--                 see finalize.lua)
-- KEYS[2] buyers  hash: user -> units held (reserved or live)
-- KEYS[3] res     hash: order_id -> reservation JSON (in flight: not yet applied in the database)
-- KEYS[4] outbox  zset: order_id scored by accepted ms (not yet acknowledged by the stream)
-- KEYS[5] idem    hash: user NUL idempotency key -> order_id; '#' order_id -> 1 once the
--                 order is closed (so a late retry of its id is a duplicate, not a new reservation)
-- KEYS[6] rl:sku  string: GCRA theoretical arrival time (µs, Redis clock) of the SKU's limit
-- KEYS[7] rl:u:<user>  the same, of the user's limit on this SKU
-- KEYS[8] rl:ip:<ip>   the same, of the client IP's limit on this SKU
--   (limit keys expire when their arrival time passes: an absent key is a full bucket)
-- ARGV[1] order_id  ARGV[2] user  ARGV[3] quantity  ARGV[4] now ms
-- ARGV[5] idempotency field ('' for none)  ARGV[6] reservation JSON
-- ARGV[7],  ARGV[8]   SKU limit:  emission interval µs (0 = off), burst
-- ARGV[9],  ARGV[10]  user limit: emission interval µs (0 = off), burst
-- ARGV[11], ARGV[12]  IP limit:   emission interval µs (0 = off), burst
--   (KEYS[6..8] and ARGV[7..12] may be left out when every limit is off)
-- Returns {code, ...}:
--   { 1, order_id, avail_after }  accepted
--   { 2, order_id }               duplicate: the order this key or id already made
--   { 0, avail }                  sold out
--   {-1, held }                   per-user limit reached
--   {-2}                          not warmed (no state for the SKU: refuse)
--   {-3}                          sale not started   {-4} sale ended
--   {-5}                          bad arguments
--   {-6, sku_ms, user_ms, ip_ms}  rate limited: ms until each limit admits again (0 = it passed)
--   {-7}                          accepted (ARGV[4]) before cfloor: the closed marker of this
--                                 order id may have been dropped; the caller asks the database
--   {-8}                          (bucketcheck.lua, run in front) the caller's bucket count is stale
-- Every request that passes the rate limits counts against them, whatever
-- the outcome (a user stuck at limit_reached who keeps clicking is limited).
-- A repeat of an order id (the caller's retry after a lost reply) does not,
-- nor a client's retry of an Idempotency-Key that made an order: it gets that
-- order back, never a rate-limit refusal.
local qty = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
if not qty or qty < 1 or qty ~= math.floor(qty) or not now or ARGV[1] == '' or ARGV[2] == '' then
  return {-5}
end
if redis.call('HEXISTS', KEYS[1], 'epoch') == 0 then
  return {-2}
end
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 or redis.call('HEXISTS', KEYS[5], '#' .. ARGV[1]) == 1 then
  return {2, ARGV[1]}
end
if ARGV[5] ~= '' then
  local prev = redis.call('HGET', KEYS[5], ARGV[5])
  if prev then return {2, prev} end
end

-- Rate limits: GCRA on Redis' clock (one clock for every instance). With
-- every limit off the caller may leave out KEYS[6..8] and ARGV[7..12].
local now_us, charge, wait
local limited = false
for i = 1, 3 do
  local t = tonumber(ARGV[5 + 2 * i])
  if t and t > 0 then
    if not now_us then
      local tm = redis.call('TIME')
      now_us = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
      charge, wait = {}, {0, 0, 0}
    end
    local burst = tonumber(ARGV[6 + 2 * i]) or 1
    if burst < 1 then burst = 1 end
    local tat = tonumber(redis.call('GET', KEYS[5 + i]) or '') or now_us
    if tat < now_us then tat = now_us end
    local new_tat = tat + t
    local allow_at = new_tat - burst * t
    if allow_at > now_us then
      wait[i] = math.ceil((allow_at - now_us) / 1000)
      limited = true
    else
      charge[i] = new_tat
    end
  end
end
if limited then
  return {-6, wait[1], wait[2], wait[3]}
end
local function count()
  if not charge then return end
  for i = 1, 3 do
    if charge[i] then
      redis.call('SET', KEYS[5 + i], string.format('%.0f', charge[i]), 'PX', math.ceil((charge[i] - now_us) / 1000) + 1)
    end
  end
end

local m = redis.call('HMGET', KEYS[1], 'avail', 'limit', 'starts', 'ends', 'inflight', 'cfloor')
local avail = tonumber(m[1])
local limit = tonumber(m[2])
if not avail or not limit then
  return {-2}
end
if m[6] and now < tonumber(m[6]) then
  return {-7}
end
local starts = tonumber(m[3]) or 0
local ends = tonumber(m[4]) or 0
if starts > 0 and now < starts then count(); return {-3} end
if ends > 0 and now >= ends then count(); return {-4} end
if avail < qty then count(); return {0, avail} end
local held = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
if held + qty > limit then count(); return {-1, held} end

count()
redis.call('HINCRBY', KEYS[1], 'avail', -qty)
redis.call('HINCRBY', KEYS[1], 'reserved', qty)
if m[5] then redis.call('HINCRBY', KEYS[1], 'inflight', qty) end
redis.call('HINCRBY', KEYS[2], ARGV[2], qty)
redis.call('HSET', KEYS[3], ARGV[1], ARGV[6])
redis.call('ZADD', KEYS[4], now, ARGV[1])
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[5], ARGV[5], ARGV[1])
end
return {1, ARGV[1], avail - qty}
