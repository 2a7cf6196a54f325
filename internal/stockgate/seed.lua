-- seed.lua: load a SKU that Redis does not hold: first warm-up, after Redis
-- lost it, or after a fence (rebuild). Does nothing if the SKU is loaded:
-- the caller resyncs instead. A SKU is loaded when its meta hash has an epoch.
-- The reserved counter survives (it only ever grows) so that a resync racing
-- with the seed can never compute from a counter that went backwards.
-- A large sale is seeded in chunks (Gate.Seed: about 1,000 fields a call), so
-- no call holds Redis for long: the first chunk starts the load (buyers
-- emptied, the meta hash's seeding set to the load's token), the next ones
-- add to it while the SKU stays unloaded (the gate refuses it), and the last
-- one marks it loaded. A chunk whose token is not the one seeding (another
-- load started meanwhile) writes nothing.
-- KEYS[1] meta  KEYS[2] buyers  KEYS[3] res  KEYS[4] rel  KEYS[5] idem
-- KEYS[6] the SKU's change lock (see Gate.LockSKU)
-- ARGV[1] available (negative: fewer units in the database than are in flight;
--   avail 0 and that many units of debt, see restore.lua)  ARGV[2] limit  ARGV[3] starts ms  ARGV[4] ends ms  ARGV[5] epoch
--   (ARGV[1..5] are used by the last chunk only)
-- ARGV[6] number of buyer pairs B   ARGV[7] number of released order ids L
-- ARGV[8] number of idempotency pairs I (of this chunk)
-- ARGV[9] the change lock's token the caller holds ('' : no lock checked)
-- ARGV[10] the load's token (random, the same for every chunk of one load)
-- ARGV[11] chunk: 'f' first, 'm' middle, 'l' last, 'o' the only one
-- ARGV[12] ms of a sold-out lease the last chunk starts the sale with (0: none;
--   see soldlease.lua: no reservation is made in the first ms after a load, so
--   that a snapshot of key holders read before Redis lost the sale, whose lease
--   went with it, ends before a key is added)
-- then 2B values: pairs of (user, units held: live orders plus reservations in flight)
-- then L values: order ids whose release the available count already includes
--   (recorded in rel, so the pending Redis restore of each is not applied again)
-- then 2I values: pairs of (user NUL Idempotency-Key, order id) of live orders
--   (they replace what the hash held: the database's order is the one kept)
-- then pairs of (order_id, reservation JSON) in flight, to (re)record in res;
--   the Idempotency-Key of each is recorded too unless the hash holds it (the
--   first pair with a key wins: the caller passes them oldest first), so that
--   a retry after Redis lost its data is answered with the reservation its
--   key made instead of making a second one
-- The meta hash's inflight (units of the res entries; reserve.lua and
-- finalize.lua keep it) is computed from res by the first chunk if absent,
-- then kept exact.
-- Returns 1 if seeded (last chunk), 2 chunk written (more to come), 0 if it
-- was already loaded, -5 if the caller's lock expired or was taken over,
-- -6 if another load took over the seed (nothing written for both), or, for a
-- first chunk while the sale's sold-out lease is live (a fenced sale keeps
-- it), minus 1,000,000 minus the ms until it ends (leasewait.lua: only the
-- lease's stop written): call the first chunk again then.
if ARGV[9] ~= '' and redis.call('GET', KEYS[6]) ~= ARGV[9] then
  return -5
end
if redis.call('HEXISTS', KEYS[1], 'epoch') == 1 then
  return 0
end
local chunk = ARGV[11]
local first, last = chunk == 'f' or chunk == 'o', chunk == 'l' or chunk == 'o'
if first then
  local wait = lease_wait(KEYS[1])
  if wait > 0 then return -1000000 - wait end
  redis.call('HSET', KEYS[1], 'seeding', ARGV[10])
  redis.call('UNLINK', KEYS[2])
  if redis.call('HEXISTS', KEYS[1], 'inflight') == 0 then
    local n = 0
    for _, v in ipairs(redis.call('HVALS', KEYS[3])) do n = n + (tonumber(cjson.decode(v)['quantity']) or 0) end
    redis.call('HSET', KEYS[1], 'inflight', n)
  end
elseif redis.call('HGET', KEYS[1], 'seeding') ~= ARGV[10] then
  return -6
end
local b, l, ik = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local i = 13
for _ = 1, b do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  i = i + 2
end
for _ = 1, l do
  redis.call('SADD', KEYS[4], ARGV[i])
  i = i + 1
end
for _ = 1, ik do
  redis.call('HSET', KEYS[5], ARGV[i], ARGV[i + 1])
  i = i + 2
end
local units = 0
while i < #ARGV do
  local old = redis.call('HGET', KEYS[3], ARGV[i])
  if old then units = units - (tonumber(cjson.decode(old)['quantity']) or 0) end
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  local r = cjson.decode(ARGV[i + 1])
  units = units + (tonumber(r['quantity']) or 0)
  local key = r['idempotency_key']
  if type(key) == 'string' and key ~= '' then
    redis.call('HSETNX', KEYS[5], r['user_id'] .. '\0' .. key, ARGV[i])
  end
  i = i + 2
end
if units ~= 0 then redis.call('HINCRBY', KEYS[1], 'inflight', units) end
if not last then
  return 2
end
redis.call('HDEL', KEYS[1], 'seeding')
redis.call('HSETNX', KEYS[1], 'reserved', 0)
redis.call('HINCRBY', KEYS[1], 'moves', 1)
local avail, debt = tonumber(ARGV[1]), 0
if avail < 0 then debt, avail = -avail, 0 end
-- layout: the version of this key layout (reserve.lua refuses a newer one).
redis.call('HSET', KEYS[1], 'avail', avail, 'debt', debt, 'limit', ARGV[2], 'starts', ARGV[3],
  'ends', ARGV[4], 'epoch', ARGV[5], 'layout', '1')
local lease = tonumber(ARGV[12]) or 0
if lease > 0 then
  local tm = redis.call('TIME')
  local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
  redis.call('HSET', KEYS[1], 'solu', string.format('%.0f', now + lease))
  redis.call('HINCRBY', KEYS[1], 'solv', 1)
end
return 1
