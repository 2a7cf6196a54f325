-- shadowrun.lua: run the candidate reserve script (the function candidate,
-- put in front of this file by shadow.go) once per journal entry, each on
-- this shadow's own keys set to the state the live decision was made from.
-- KEYS[1..6] the shadow's meta, buyers, res, outbox, idem and journal (the
--   candidate's layout of KEYS[1..6]; no rate-limit keys: limits are off)
-- ARGV: groups of 13 journal fields: o u q t k b a l s e h d x (reserve.lua)
-- Returns the candidate's reply of each entry, in order; {'error', text}
-- for an entry on which the candidate raised an error (a decision too: it
-- differs). The keys are dropped at the end: nothing of a shadow stays in
-- Redis between calls.
local out = {}
for i = 1, #ARGV, 13 do
  local o, u, q, t, k, b = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
  local a, l, s, e, h, d, x = ARGV[i + 6], ARGV[i + 7], ARGV[i + 8], ARGV[i + 9], ARGV[i + 10], ARGV[i + 11], ARGV[i + 12]
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
  local meta = {'epoch', 'shadow', 'buckets', b, 'reserved', '0'}
  for _, f in ipairs({{'avail', a}, {'limit', l}, {'starts', s}, {'ends', e}}) do
    if f[2] ~= '' then
      meta[#meta + 1] = f[1]
      meta[#meta + 1] = f[2]
    end
  end
  redis.call('HSET', KEYS[1], unpack(meta))
  if h ~= '0' then
    redis.call('HSET', KEYS[2], u, h)
  end
  -- The live path found the order id or key already known: so does the
  -- candidate (the order in flight, or the key pointing at its order).
  if d == '2' then
    if x == o or k == '' then
      redis.call('HSET', KEYS[3], o, '{}')
    else
      redis.call('HSET', KEYS[5], k, x)
    end
  end
  local ok, r = pcall(candidate, KEYS, {o, u, q, t, k, '{}', b})
  if not ok then
    if type(r) == 'table' then r = r.err end
    r = {'error', tostring(r)}
  end
  out[#out + 1] = r
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
return out
