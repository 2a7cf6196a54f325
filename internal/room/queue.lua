-- queue.lua: join the waiting room, or poll one's place in it (one call,
-- O(1): the member's field and the state hash). After lottery.lua.
-- KEYS[1] state   hash: next (join numbers given), P, seed, drawn (the draw),
--                 served, frac, rate, avail, conv, tick (the controller's),
--                 issued (buyers told they are admitted), opens
-- KEYS[2] members hash: user -> "j:predicted:admitted" (join number; ms at
--                 which the first ETA given predicted admission, '' none yet;
--                 ms of the first admitted answer, '' none yet)
-- ARGV[1] mode: 'join' or 'poll'
-- ARGV[2] user
-- ARGV[3] now (unix ms)
-- ARGV[4] opens (unix ms, the sale's StartsAt)
-- ARGV[5] lottery seed to record if this call draws (lottery.lua)
-- ARGV[6] admission TTL (ms)
-- ARGV[7] stale (ms): a rate the controller wrote longer ago is unknown
-- ARGV[8] key TTL (s), set on both keys when a buyer joins
-- Returns {code, j, position, served, rate, predicted, admitted, new}
--   code 0 not in the queue (poll only; nothing written)
--        1 waiting (position 0: the lottery is not drawn yet)
--        2 admitted  3 sold out  4 admission expired
--   rate: string, '-1' when unknown (no controller write within stale)
--   predicted, admitted: ms, -1 when none; new: 1 if this call joined,
--   2 if this call gave the first admitted answer, else 0
local state, members = KEYS[1], KEYS[2]
local user = ARGV[2]
local now, opens = tonumber(ARGV[3]), tonumber(ARGV[4])

local mv = redis.call('HGET', members, user)
if not mv and ARGV[1] ~= 'join' then return {0} end

local p = draw(state, now, opens, ARGV[5])
local flag = 0
if not mv then
  local j = redis.call('HINCRBY', state, 'next', 1)
  mv = j .. '::'
  redis.call('HSET', members, user, mv)
  if j == 1 then redis.call('HSET', state, 'opens', opens) end
  local ttl = tonumber(ARGV[8])
  redis.call('EXPIRE', state, ttl)
  redis.call('EXPIRE', members, ttl)
  flag = 1
end

local js, pred, adm = string.match(mv, '^(%d+):(%d*):(%d*)$')
local j = tonumber(js)
local st = redis.call('HMGET', state, 'seed', 'served', 'rate', 'avail', 'tick')
local served = tonumber(st[2] or '0')
local rate = '-1'
if st[5] and now - tonumber(st[5]) <= tonumber(ARGV[7]) then rate = st[3] or '-1' end
local predn = tonumber(pred) or -1

if not p then return {1, j, 0, served, rate, predn, -1, flag} end
local pos = j
if j <= p then pos = perm(j - 1, p, st[1]) + 1 end

if pos <= served then
  if adm == '' then
    adm = string.format('%d', now)
    redis.call('HSET', members, user, js .. ':' .. pred .. ':' .. adm)
    redis.call('HINCRBY', state, 'issued', 1)
    flag = 2
  end
  local admn = tonumber(adm)
  if now >= admn + tonumber(ARGV[6]) then return {4, j, pos, served, rate, predn, admn, flag} end
  return {2, j, pos, served, rate, predn, admn, flag}
end
if st[4] and tonumber(st[4]) <= 0 then return {3, j, pos, served, rate, predn, -1, flag} end
local r = tonumber(rate)
if pred == '' and r > 0 then
  predn = now + math.floor((pos - served) / r * 1000)
  redis.call('HSET', members, user, js .. ':' .. string.format('%d', predn) .. ':')
end
return {1, j, pos, served, rate, predn, -1, flag}
