-- reserve.lua: admit one purchase atomically. Validates everything before the
-- first write (a Lua error after a write keeps the write).
-- KEYS[1] meta    hash: avail, limit, starts, ends (ms, 0 = none), reserved, epoch
-- KEYS[2] buyers  hash: user -> units held (reserved or live)
-- KEYS[3] res     hash: order_id -> reservation JSON (in flight: not yet applied in the database)
-- KEYS[4] outbox  zset: order_id scored by accepted ms (not yet acknowledged by the stream)
-- KEYS[5] idem    hash: user NUL idempotency key -> order_id
-- ARGV[1] order_id  ARGV[2] user  ARGV[3] quantity  ARGV[4] now ms
-- ARGV[5] idempotency field ('' for none)  ARGV[6] reservation JSON
-- Returns {code, ...}:
--   { 1, order_id, avail_after }  accepted
--   { 2, order_id }               duplicate: the order this key or id already made
--   { 0, avail }                  sold out
--   {-1, held }                   per-user limit reached
--   {-2}                          not warmed (no state for the SKU: refuse)
--   {-3}                          sale not started   {-4} sale ended
--   {-5}                          bad arguments
local qty = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
if not qty or qty < 1 or qty ~= math.floor(qty) or not now or ARGV[1] == '' or ARGV[2] == '' then
  return {-5}
end
if redis.call('HEXISTS', KEYS[1], 'epoch') == 0 then
  return {-2}
end
if ARGV[5] ~= '' then
  local prev = redis.call('HGET', KEYS[5], ARGV[5])
  if prev then return {2, prev} end
end
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then
  return {2, ARGV[1]}
end
local m = redis.call('HMGET', KEYS[1], 'avail', 'limit', 'starts', 'ends')
local avail = tonumber(m[1])
local limit = tonumber(m[2])
if not avail or not limit then
  return {-2}
end
local starts = tonumber(m[3]) or 0
local ends = tonumber(m[4]) or 0
if starts > 0 and now < starts then return {-3} end
if ends > 0 and now >= ends then return {-4} end
if avail < qty then return {0, avail} end
local held = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
if held + qty > limit then return {-1, held} end

redis.call('HINCRBY', KEYS[1], 'avail', -qty)
redis.call('HINCRBY', KEYS[1], 'reserved', qty)
redis.call('HINCRBY', KEYS[2], ARGV[2], qty)
redis.call('HSET', KEYS[3], ARGV[1], ARGV[6])
redis.call('ZADD', KEYS[4], now, ARGV[1])
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[5], ARGV[5], ARGV[1])
end
return {1, ARGV[1], avail - qty}
