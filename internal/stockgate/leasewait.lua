-- leasewait.lua (put in front of the scripts that add key fields to a sale's
-- idem hash other than reserve.lua: restore.lua, seed.lua): a writer of a
-- new key field must not write while a sold-out lease is live
-- (soldlease.lua), since instances answer from snapshots of the key holders
-- until it ends. lease_wait(meta) returns 0 when none is live; otherwise
-- it stops every renewal (solv incremented), keeps new leases from being
-- taken until 2 s after this one ends (solb, so the writer has its turn),
-- and returns the ms until the lease ends: the caller writes nothing and
-- is called again after that.
local function lease_wait(meta)
  local u = tonumber(redis.call('HGET', meta, 'solu') or '')
  if not u then return 0 end
  local tm = redis.call('TIME')
  local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
  if now >= u then return 0 end
  redis.call('HINCRBY', meta, 'solv', 1)
  local b = tonumber(redis.call('HGET', meta, 'solb') or '') or 0
  if b < u + 2000 then redis.call('HSET', meta, 'solb', string.format('%.0f', u + 2000)) end
  return u - now
end
