-- lottery.lua: the keyed permutation of lottery.go (same arithmetic, every
-- intermediate below 2^53) and the draw. Put in front of queue.lua and
-- tick.lua; defines functions only.

local PRIME = 1048573

-- perm(x, p, seed): the place in [0,p) of x in [0,p) under seed, the
-- comma-separated round keys ("k1,...,k8").
local function perm(x, p, seed)
  if p <= 1 then return 0 end
  local k = {}
  for v in string.gmatch(seed, '%d+') do k[#k + 1] = tonumber(v) end
  local half = 2
  while half * half < p do half = half * 2 end
  local function feistel(v)
    local l, r = math.floor(v / half), v % half
    for i = 1, 4 do
      local t = (r + k[2 * i - 1]) % PRIME
      t = (t * t) % PRIME
      t = (t * t + k[2 * i]) % PRIME
      l, r = r, (l + t) % half
    end
    return l * half + r
  end
  local y = feistel(x)
  while y >= p do y = feistel(y) end
  return y
end

-- draw(state, now, opens, seed): at or after the opening, record once the
-- number of buyers who joined before it (P) and the lottery's keys. Every
-- script that reads positions calls it first, so a join after the opening
-- is numbered after the draw whichever script runs first.
-- Returns P (false before the opening).
local function draw(state, now, opens, seed)
  local p = redis.call('HGET', state, 'P')
  if p then return tonumber(p) end
  if now < opens then return false end
  local n = tonumber(redis.call('HGET', state, 'next') or '0')
  redis.call('HSET', state, 'P', n, 'seed', seed, 'drawn', now)
  return n
end
