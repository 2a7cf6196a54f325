-- shadowlease.lua: a shadow's journal lease on a bucket (see shadow.go).
-- Each running shadow holds its own lease (holders: token -> end ms); the
-- reserve script reads one field, meta's shadow: the latest end of them.
-- KEYS[1] meta  KEYS[2] holders hash  KEYS[3] journal
-- ARGV[1] 'on' or 'off'  ARGV[2] this lease's end ms  ARGV[3] journal length
-- ARGV[4] the shadow's token  ARGV[5] now ms
-- on: record the lease if the bucket is loaded. off: drop it; the last
-- lease dropped ends journaling at once and deletes the journal.
-- Returns 1 if the bucket is loaded (on) or the lease was dropped (off), else 0.
local now = tonumber(ARGV[5])
if ARGV[1] == 'on' then
  if redis.call('HEXISTS', KEYS[1], 'epoch') == 0 then
    return 0
  end
  redis.call('HSET', KEYS[2], ARGV[4], ARGV[2])
else
  redis.call('HDEL', KEYS[2], ARGV[4])
end
local latest = 0
local h = redis.call('HGETALL', KEYS[2])
for i = 1, #h, 2 do
  local e = tonumber(h[i + 1]) or 0
  if e <= now then
    redis.call('HDEL', KEYS[2], h[i])
  elseif e > latest then
    latest = e
  end
end
if latest > 0 then
  redis.call('HSET', KEYS[1], 'shadow', latest, 'shadowlen', ARGV[3])
  redis.call('PEXPIREAT', KEYS[2], latest)
else
  redis.call('HDEL', KEYS[1], 'shadow', 'shadowlen')
  redis.call('DEL', KEYS[2], KEYS[3])
end
return 1
