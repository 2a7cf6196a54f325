-- soldlease.lua: take or renew a sale's sold-out lease (docs/architecture.md,
-- "Answering keyed sold-out from memory"). While Redis' clock is before the
-- meta hash's solu, reserve.lua makes no reservation (it answers sold out,
-- a key that made an order still gets it), and every other writer of a key
-- field of idem first increments solv (so no renewal extends the lease) and
-- then waits until solu has passed (restore.lua, seed.lua): no key is added
-- to the sale while the lease is live, so a snapshot of its key holders read
-- with it answers "this key made no order" until the lease ends.
-- A lease is granted only to an unsplit, loaded sale with no unit left.
-- KEYS[1] meta  KEYS[2] idem
-- ARGV[1] the lease's length, ms
-- ARGV[2] '' to take it (the key fields are returned; a take that finds no
--         live lease increments solv first), or the version (solv) a
--         renewal's holder read with its snapshot
-- ARGV[3] the epoch the holder read with its snapshot (renewal only)
-- ARGV[4] the most key fields (user NUL key) a snapshot may hold: a sale with
--         more idem fields than this (closed markers counted) is refused
-- Returns
--   {1, version, epoch, now_ms, field...}  taken (the key fields of idem, not the
--                                          '#' closed markers) or renewed (no field)
--   {0, reason}                            refused: 'unloaded', 'split', 'units',
--                                          'changed' (a renewal whose version or
--                                          epoch moved, or whose lease lapsed),
--                                          'large', 'blocked' (a writer waits for
--                                          the lease to lapse); the holder drops
--                                          its snapshot
local ttl = tonumber(ARGV[1])
if not ttl or ttl < 1 then
  return redis.error_reply('soldlease: bad lease length')
end
local m = redis.call('HMGET', KEYS[1], 'epoch', 'avail', 'buckets', 'solu', 'solv', 'solb')
if not m[1] then return {0, 'unloaded'} end
if (m[3] or '1') ~= '1' then return {0, 'split'} end
if (tonumber(m[2]) or 1) > 0 then return {0, 'units'} end
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
-- solb: a writer waits for the lease to lapse (leasewait.lua); no lease is
-- taken or renewed before it had its turn.
if now < (tonumber(m[6] or '') or 0) then return {0, 'blocked'} end
local untl = tonumber(m[4] or '') or 0
local version = m[5] or '0'
-- Always written, also when an earlier grant reaches further: the caller's
-- WAIT then covers the lease it relies on (a client's WAIT counts only the
-- writes it made).
local function extend()
  redis.call('HSET', KEYS[1], 'solu', string.format('%.0f', math.max(untl, now + ttl)))
end
if ARGV[2] ~= '' then
  if ARGV[2] ~= version or ARGV[3] ~= m[1] or untl <= now then return {0, 'changed'} end
  extend()
  return {1, version, m[1], now}
end
local cap = tonumber(ARGV[4]) or 0
if redis.call('HLEN', KEYS[2]) > cap then return {0, 'large'} end
-- A take that finds no live lease starts a new one under a new version:
-- reservations made since the last one lapsed added keys without a bump,
-- so no renewal of a snapshot read before may pass (a holder that stalled
-- past its lease would otherwise renew it once another instance has
-- taken the next one).
-- The new version is at least Redis' clock in µs, so a Redis restarted from
-- older persisted data (solv gone back) does not hand out one again.
if untl <= now then
  version = string.format('%.0f', math.max((tonumber(version) or 0) + 1, now * 1000))
  redis.call('HSET', KEYS[1], 'solv', version)
end
extend()
local out = {1, version, m[1], now}
for _, f in ipairs(redis.call('HKEYS', KEYS[2])) do
  if string.byte(f, 1) ~= 35 then out[#out + 1] = f end -- 35: '#'
end
return out
