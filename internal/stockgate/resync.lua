-- resync.lua: set a loaded SKU's available units from the database without
-- re-selling units in flight (the second half of a resync).
-- The caller read, atomically, the in-flight set R and the reserved counter C1
-- (inflight.lua), then, in one database snapshot, the stock S, which of R
-- the database has processed, and the releases whose Redis restore is still
-- pending (S already includes their units). Then:
--   available = S - (units of R not processed) - (units reserved since C1)
-- (negative: the gate owes that many units, recorded as debt, see restore.lua)
-- A unit reserved after R was read and decided in the database before the
-- snapshot would be counted twice (in S and in the reserved counter) and stay
-- out of Redis for good: the caller holds the SKU's stock row locked from
-- before reading R until S is read (orderstore's LockedSnapshot), so no
-- decision can land in between. Processed entries of R are closed here, and pending
-- restores are marked done (their buyer slot given back), so that a late
-- finalize or restore cannot give units back a second time.
-- Any other change of avail or debt since the read (a refusal or release
-- given back, a fallback sale's or an outside decrement's debit, an admin
-- change: each bumps the moves counter, see debt.lua) may be missing from
-- the snapshot or counted in it twice: the resync is refused and the caller
-- reads again. Reservations need no such check: the reserved counter
-- accounts for them (at worst undersold for a moment).
-- KEYS[1] meta  KEYS[2] buyers  KEYS[3] res  KEYS[4] outbox  KEYS[5] rel  KEYS[6] idem
-- KEYS[7] the SKU's change lock (see Gate.LockSKU)
-- KEYS[8] closed  zset: the closed markers' index (see finalize.lua)
-- ARGV[1] S  ARGV[2] C1  ARGV[3] units of R not processed
-- ARGV[4] limit  ARGV[5] starts ms  ARGV[6] ends ms  ARGV[7] number P of processed entries
-- ARGV[8] epoch seen with R: if the SKU was re-seeded since (a lost Redis,
--   a rebuild), R and C1 describe another life of it: refuse.
-- ARGV[9] moves counter seen with R  ARGV[10] the change lock's token the
--   caller holds ('' : no lock checked)
-- then P pairs (order_id, 'a' applied | 'f' refused) for processed entries of R
-- then triples (order_id, user, units) of pending restores
-- Returns {avail, debt} (avail >= 0), {-2} if the SKU is not loaded, {-3} if it was re-seeded
-- since R was read, {-4} if units moved since R was read (the caller reads
-- again for both), {-5} if the caller's lock expired or was taken over.
-- The meta hash's inflight (units of the res entries) is kept exact, and
-- computed from res if absent (a SKU loaded by a version without it).
-- Nothing is written unless it returns {avail, debt}.
if ARGV[10] ~= '' and redis.call('GET', KEYS[7]) ~= ARGV[10] then
  return {-5}
end
if redis.call('HEXISTS', KEYS[1], 'epoch') == 0 then
  return {-2}
end
local cnow = tonumber(redis.call('HGET', KEYS[1], 'reserved')) or 0
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[8] or cnow < tonumber(ARGV[2]) then
  return {-3}
end
if (tonumber(redis.call('HGET', KEYS[1], 'moves')) or 0) ~= tonumber(ARGV[9]) then
  return {-4}
end
local avail = tonumber(ARGV[1]) - tonumber(ARGV[3]) - (cnow - tonumber(ARGV[2]))
-- Fewer units in the database than reservations in flight (a decrement made
-- outside the gate): the shortfall is debt, paid by the refusals to come.
local debt = 0
if avail < 0 then debt, avail = -avail, 0 end
local function release_slot(user, qty)
  if user == '' then return end
  local left = redis.call('HINCRBY', KEYS[2], user, -qty)
  if left <= 0 then redis.call('HDEL', KEYS[2], user) end
end
local i = 11
local closed = 0
for _ = 1, tonumber(ARGV[7]) do
  local id, outcome = ARGV[i], ARGV[i + 1]
  local payload = redis.call('HGET', KEYS[3], id)
  if payload then
    local r = cjson.decode(payload)
    if outcome == 'f' then
      release_slot(r['user_id'], tonumber(r['quantity']))
    end
    closed = closed + (tonumber(r['quantity']) or 0)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HSET', KEYS[6], '#' .. id, 1)
    redis.call('ZADD', KEYS[8], tonumber(r['accepted_at']) or 0, id)
  end
  redis.call('ZREM', KEYS[4], id)
  i = i + 2
end
if redis.call('HEXISTS', KEYS[1], 'inflight') == 1 then
  if closed > 0 then redis.call('HINCRBY', KEYS[1], 'inflight', -closed) end
else
  local n = 0
  for _, v in ipairs(redis.call('HVALS', KEYS[3])) do n = n + (tonumber(cjson.decode(v)['quantity']) or 0) end
  redis.call('HSET', KEYS[1], 'inflight', n)
end
while i + 2 <= #ARGV do
  if redis.call('SADD', KEYS[5], ARGV[i]) == 1 then
    release_slot(ARGV[i + 1], tonumber(ARGV[i + 2]))
  end
  i = i + 3
end
-- avail and debt are computed from the database's truth.
redis.call('HSET', KEYS[1], 'avail', avail, 'debt', debt, 'limit', ARGV[4], 'starts', ARGV[5], 'ends', ARGV[6])
redis.call('HINCRBY', KEYS[1], 'moves', 1)
return {avail, debt}
