-- The instances taking leases (src/store/redis/lease.rs): KEYS[1] a sorted set of
-- instances by when they last leased (ms, Redis's clock); ARGV[1] this instance, ARGV[2]
-- the window (ms). Records this instance now, drops those not seen within the window and
-- answers how many are left.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local within = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - within)
redis.call('PEXPIRE', KEYS[1], within * 2)
return redis.call('ZCARD', KEYS[1])
