-- reserve.lua: admit one purchase atomically, rate limits included. Every
-- check (arguments, rate limits, duplicates, window, stock, per-user limit)
-- is read-only and comes before the first write (a Lua error after a write
-- keeps the write). A request a rate limit refuses writes nothing at all.
-- KEYS[1] meta    hash: avail, limit, starts, ends (ms, 0 = none), reserved, epoch,
--                 inflight (units of the res entries, kept when present: see seed.lua),
--                 cfloor (closed markers of reservations accepted before it are dropped,
--                 see finalize.lua), solu (the sold-out lease's end, ms on Redis' clock:
--                 see soldlease.lua)
-- KEYS[2] buyers  hash: user -> units held (reserved or live)
-- KEYS[3] res     hash: order_id -> reservation JSON (in flight: not yet applied in the database)
-- KEYS[4] outbox  zset: order_id scored by accepted ms (not yet acknowledged by the stream)
-- KEYS[5] idem    hash: user NUL idempotency key -> order_id; '#' order_id -> 1 once the
--                 order is closed (so a late retry of its id is a duplicate, not a new reservation)
-- KEYS[6] journal stream: the decisions of this script while a shadow reads them
--                 (meta's shadow field, ms, is in the future: see shadow.go), each with
--                 the state it was made from, trimmed to about meta's shadowlen entries
-- KEYS[7] rl:sku  string: GCRA theoretical arrival time (µs, Redis clock) of the SKU's limit
-- KEYS[8] rl:u:<user>  the same, of the user's limit on this SKU
-- KEYS[9] rl:ip:<ip>   the same, of the client IP's limit on this SKU
--   (limit keys expire when their arrival time passes: an absent key is a full bucket)
-- ARGV[1] order_id  ARGV[2] user  ARGV[3] quantity  ARGV[4] now ms
-- ARGV[5] idempotency field ('' for none)  ARGV[6] reservation JSON
-- ARGV[7],  ARGV[8]   SKU limit:  emission interval µs (0 = off), burst
-- ARGV[9],  ARGV[10]  user limit: emission interval µs (0 = off), burst
-- ARGV[11], ARGV[12]  IP limit:   emission interval µs (0 = off), burst
--   (KEYS[7..9] and ARGV[7..12] may be left out when every limit is off)
-- ARGV[#ARGV] (last)  the number of stock buckets the caller believes the sale has
--                 (removed first, so the arguments above keep their numbers)
-- Returns {code, ...}:
--   { 1, order_id, avail_after }  accepted
--   { 2, order_id }               duplicate: the order this key or id already made
--   { 0, avail }                  sold out (avail may be >= quantity while a sold-out
--                                 lease is live: the units sell once it lapses)
--   {-1, held }                   per-user limit reached
--   {-2}                          not warmed (no state for the SKU: refuse)
--   {-3}                          sale not started   {-4} sale ended
--   {-5}                          bad arguments
--   {-6, sku_ms, user_ms, ip_ms}  rate limited: ms until each limit admits again (0 = it passed)
--   {-7}                          accepted (ARGV[4]) before cfloor: the closed marker of this
--                                 order id may have been dropped; the caller asks the database
--   {-8}                          the caller's bucket count is stale (the sale was re-split)
--   {-9}                          the bucket was seeded in a layout newer than this script's (1)
-- The decisions journaled for a shadow are 2, -3, -4, 0, -1 and 1 (not -2,
-- -5, -6, -7, -8: they are about this call, not the sale): one XADD with the
-- order id, user, quantity, now, idempotency field and bucket count (n is a
-- sequence number kept in meta, so that a reader counts what it missed; r
-- the deciding script's SCRIPT_ID, which the gate puts in front of this
-- file, so that a shadow does not count a script agreeing with itself), the
-- state the decision was made from (avail, limit, starts, ends, the user's
-- held units) and the decision (d: code, x: its value: the order id, units
-- left or held).
-- Every request that passes the rate limits counts against them, whatever
-- the outcome (a user stuck at limit_reached who keeps clicking is limited).
-- A repeat of an order id (the caller's retry after a lost reply) does not,
-- nor a client's retry of an Idempotency-Key that made an order: it gets that
-- order back, never a rate-limit refusal.
local want = table.remove(ARGV)
local qty = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
if not qty or qty < 1 or qty ~= math.floor(qty) or not now or ARGV[1] == '' or ARGV[2] == '' then
  return {-5}
end
-- Every field of the meta hash this call reads, in one command: each
-- redis.call costs about a microsecond of Lua-to-Redis conversion on top of
-- the command itself, and the reserve is the hottest script of the system.
local m = redis.call('HMGET', KEYS[1], 'epoch', 'buckets', 'avail', 'limit', 'starts', 'ends', 'inflight', 'cfloor', 'reserved', 'shadow', 'shadowlen', 'layout', 'solu')
if not m[1] then
  return {-2}
end
-- The layout the bucket was seeded with (seed.lua; absent: 1, the first):
-- one this script does not know was written by a newer release, whose
-- instances serve it. Nothing written.
if m[12] and (tonumber(m[12]) or 2) > 1 then
  return {-9}
end
local function journal(code, x, held)
  if not m[10] or (tonumber(m[10]) or 0) <= now then return end
  local n = redis.call('HINCRBY', KEYS[1], 'shadowseq', 1)
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', m[11] or '10000', '*', 'n', n, 'r', SCRIPT_ID or '', 'o', ARGV[1], 'u', ARGV[2],
    'q', ARGV[3], 't', ARGV[4], 'k', ARGV[5], 'b', want, 'a', m[3] or '', 'l', m[4] or '', 's', m[5] or '', 'e', m[6] or '',
    'h', held or redis.call('HGET', KEYS[2], ARGV[2]) or '0', 'd', code, 'x', x)
end
-- A bucket seeded for another number of buckets than the caller believes
-- (the sale was re-split and the caller's catalog is stale): nothing
-- written, a buyer must always buy from the home bucket the current split
-- gives them.
if (m[2] or '1') ~= want then
  return {-8}
end
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then
  journal(2, ARGV[1])
  return {2, ARGV[1]}
end
if ARGV[5] ~= '' then
  local d = redis.call('HMGET', KEYS[5], '#' .. ARGV[1], ARGV[5])
  if d[1] then journal(2, ARGV[1]); return {2, ARGV[1]} end
  if d[2] then journal(2, d[2]); return {2, d[2]} end
elseif redis.call('HEXISTS', KEYS[5], '#' .. ARGV[1]) == 1 then
  journal(2, ARGV[1])
  return {2, ARGV[1]}
end

-- Rate limits: GCRA on Redis' clock (one clock for every instance). With
-- every limit off the caller may leave out KEYS[7..9] and ARGV[7..12].
local now_us, charge, wait
local limited = false
local on = {}
for i = 1, 3 do
  local t = tonumber(ARGV[5 + 2 * i])
  if t and t > 0 then on[i] = t end
end
if on[1] or on[2] or on[3] then
  local tm = redis.call('TIME')
  now_us = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
  charge, wait = {}, {0, 0, 0}
  local tats = redis.call('MGET', KEYS[7], KEYS[8], KEYS[9])
  for i = 1, 3 do
    local t = on[i]
    if t then
      local burst = tonumber(ARGV[6 + 2 * i]) or 1
      if burst < 1 then burst = 1 end
      local tat = tonumber(tats[i] or '') or now_us
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
end
if limited then
  return {-6, wait[1], wait[2], wait[3]}
end
local function count()
  if not charge then return end
  for i = 1, 3 do
    if charge[i] then
      redis.call('SET', KEYS[6 + i], string.format('%.0f', charge[i]), 'PX', math.ceil((charge[i] - now_us) / 1000) + 1)
    end
  end
end

local avail = tonumber(m[3])
local limit = tonumber(m[4])
if not avail or not limit then
  return {-2}
end
if m[8] and now < tonumber(m[8]) then
  return {-7}
end
local starts = tonumber(m[5]) or 0
local ends = tonumber(m[6]) or 0
if starts > 0 and now < starts then count(); journal(-3, ''); return {-3} end
if ends > 0 and now >= ends then count(); journal(-4, ''); return {-4} end
-- A sold-out lease (soldlease.lua) is live while Redis' clock is before
-- solu: instances may answer a keyed sold_out from their snapshot of the
-- key holders, so no reservation (no new key) is made, even when units came
-- back since; its renewals stop once they have, and the units sell when it
-- lapses. A key that made an order got it above.
local leased = false
if m[13] and avail >= qty then
  local ms
  if now_us then
    ms = math.floor(now_us / 1000)
  else
    local tm = redis.call('TIME')
    ms = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
  end
  leased = ms < (tonumber(m[13]) or 0)
end
if avail < qty or leased then count(); journal(0, avail); return {0, avail} end
local held = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
if held + qty > limit then count(); journal(-1, held, held); return {-1, held} end

count()
journal(1, avail - qty, held)
-- avail, reserved and inflight in one write (the values read above; the
-- script is atomic, so this is HINCRBY's result exactly).
local function int(v) return string.format('%.0f', v) end
if m[7] then
  redis.call('HSET', KEYS[1], 'avail', int(avail - qty), 'reserved', int((tonumber(m[9]) or 0) + qty), 'inflight', int(tonumber(m[7]) + qty))
else
  redis.call('HSET', KEYS[1], 'avail', int(avail - qty), 'reserved', int((tonumber(m[9]) or 0) + qty))
end
redis.call('HINCRBY', KEYS[2], ARGV[2], qty)
redis.call('HSET', KEYS[3], ARGV[1], ARGV[6])
redis.call('ZADD', KEYS[4], now, ARGV[1])
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[5], ARGV[5], ARGV[1])
end
return {1, ARGV[1], avail - qty}
