-- tick.lua: one step of the admission controller, by the lease holder
-- only (a holder that lost its lease is fenced off). After lottery.lua.
-- KEYS[1] state hash (queue.lua)   KEYS[2] lease string: the holder's id
-- ARGV[1] owner   ARGV[2] now (ms)   ARGV[3] opens (ms)
-- ARGV[4] rate (admissions/s, computed by the holder; 0 holds served)
-- ARGV[5] avail (units of stock left; '' unknown)   ARGV[6] conv
-- ARGV[7] lottery seed to record if this call draws
-- ARGV[8] max step (ms): a longer gap since the last tick (a takeover)
--         advances by this much, not in one burst
-- ARGV[9] key TTL (s)
-- Returns {served before, served after, next}, or {-1} when owner does not
-- hold the lease.
local state, lease = KEYS[1], KEYS[2]
if redis.call('GET', lease) ~= ARGV[1] then return {-1} end
local now, opens = tonumber(ARGV[2]), tonumber(ARGV[3])
draw(state, now, opens, ARGV[7])
local st = redis.call('HMGET', state, 'served', 'frac', 'tick', 'next')
local served = tonumber(st[1] or '0')
local frac = tonumber(st[2] or '0')
local nxt = tonumber(st[4] or '0')
local rate = tonumber(ARGV[4])
local after = served
if now >= opens and rate > 0 and st[3] then
  -- Time before the opening admits nobody.
  local dt = math.min(now - math.max(tonumber(st[3]), opens), tonumber(ARGV[8]))
  if dt > 0 then
    local acc = frac + rate * dt / 1000
    local n = math.floor(acc)
    frac = acc - n
    after = served + n
    if after >= nxt then after, frac = math.max(served, nxt), 0 end
  end
end
redis.call('HSET', state, 'served', after, 'frac', tostring(frac), 'rate', ARGV[4],
  'conv', ARGV[6], 'tick', ARGV[2])
if ARGV[5] == '' then
  redis.call('HDEL', state, 'avail')
else
  redis.call('HSET', state, 'avail', ARGV[5])
end
redis.call('EXPIRE', state, tonumber(ARGV[9]))
return {served, after, nxt}
