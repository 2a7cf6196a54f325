-- xferdone.lua: close a transfer's journal entry in the donor (see
-- xferout.lua): 'done' after the receiver was credited, 'refund' when it
-- never can be (xferin.lua said -3): the units come back to the donor,
-- unless the donor was loaded again since (its rebuild counted them).
-- KEYS[1] donor meta  KEYS[2] donor xfer
-- ARGV[1] transfer id  ARGV[2] 'done' | 'refund'
-- Returns the units refunded (0 for done, or an entry already closed).
local e = redis.call('HGET', KEYS[2], ARGV[1])
if not e then
  return 0
end
redis.call('HDEL', KEYS[2], ARGV[1])
if ARGV[2] ~= 'refund' then
  return 0
end
local r = cjson.decode(e)
if redis.call('HGET', KEYS[1], 'epoch') ~= r['from'] then
  return 0
end
give(tonumber(r['units']))
return tonumber(r['units'])
