-- fence.lua: unload a SKU so the gate refuses it until it is seeded again
-- (rebuild after Redis lost writes, or after the database fallback sold
-- while Redis was out). Keeps the reserved counter and the in-flight entries.
-- KEYS[1] meta
-- Returns 1.
redis.call('HDEL', KEYS[1], 'epoch', 'avail', 'debt')
redis.call('HINCRBY', KEYS[1], 'moves', 1)
return 1
