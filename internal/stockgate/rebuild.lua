-- rebuild.lua: the run-id monitor's record (see Gate.MarkRunID, ClaimRebuild,
-- EndRebuild). One script, three operations, so the keys of one record are
-- always changed together.
-- KEYS[1] runid    string: the run id the sales were last loaded for (the previous
--                  release reads and swaps it with SET GET; its meaning is unchanged)
-- KEYS[2] pending  string: the run id a rebuild is pending for, until one succeeds
-- KEYS[3] lease    string: the token of the instance rebuilding (PX: it ends by itself
--                  if that instance crashed)
-- (KEYS[2..3] carry KEYS[1]'s hash tag: one slot on a Redis Cluster)
-- ARGV[1] op: 'mark' | 'claim' | 'end'
-- mark:  ARGV[2] run id  ARGV[3] token  ARGV[4] lease ms
--        records the run id if another (or none) is recorded, marks a rebuild
--        pending for it and gives the lease to token.
--        Returns {previous run id or '', 1 if marked else 0}.
-- claim: ARGV[2] token  ARGV[3] lease ms
--        if a rebuild is pending and the lease is free or token's, (re)takes it.
--        Returns {pending run id or '', 1 if token holds the lease else 0}.
-- end:   ARGV[2] run id  ARGV[3] token  ARGV[4] '1' when the rebuild succeeded
--        clears the pending mark if it still names the run id (success only)
--        and frees token's lease. Returns 1.
local op = ARGV[1]
if op == 'mark' then
  local prev = redis.call('GET', KEYS[1])
  if prev == ARGV[2] then return {prev, 0} end
  redis.call('SET', KEYS[1], ARGV[2])
  redis.call('SET', KEYS[2], ARGV[2])
  redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[4])
  return {prev or '', 1}
elseif op == 'claim' then
  local p = redis.call('GET', KEYS[2])
  if not p then return {'', 0} end
  local l = redis.call('GET', KEYS[3])
  if l and l ~= ARGV[2] then return {p, 0} end
  redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
  return {p, 1}
elseif op == 'end' then
  if ARGV[4] == '1' and redis.call('GET', KEYS[2]) == ARGV[2] then
    redis.call('DEL', KEYS[2])
  end
  if redis.call('GET', KEYS[3]) == ARGV[3] then
    redis.call('DEL', KEYS[3])
  end
  return 1
end
return redis.error_reply('rebuild.lua: unknown op')
