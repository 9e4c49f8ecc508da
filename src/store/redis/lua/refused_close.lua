-- Counts a completed window of a rule's refused keys (src/store/refused.rs): once, the first
-- instance to ask computes and records the counts, the others read them.
-- KEYS[1]: the window's set; KEYS[2]: its level; KEYS[3]: the history (sorted set: hash ->
-- start of the last window that refused it, ms); KEYS[4]: the history's level; KEYS[5]: the
-- window's counts. ARGV[1]: the window's start (ms); ARGV[2]: the history's cutoff (ms);
-- ARGV[3]: the history's time to live (ms); ARGV[4]: the most hashes the history keeps;
-- ARGV[5]: how long the counts are kept (ms).
-- Answers {distinct, new}.
local done = redis.call('HMGET', KEYS[5], 'distinct', 'new')
if done[1] then
  return {tonumber(done[1]), tonumber(done[2])}
end
local level = tonumber(redis.call('GET', KEYS[2]) or '0')
local hlevel = tonumber(redis.call('GET', KEYS[4]) or '0')
local both = math.max(level, hlevel)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. ARGV[2])
local hashes = redis.call('SMEMBERS', KEYS[1])
local new = 0
for _, h in ipairs(hashes) do
  if tonumber(h) % (2 ^ both) == 0 and not redis.call('ZSCORE', KEYS[3], h) then
    new = new + 1
  end
end
local distinct = #hashes * 2 ^ level
new = math.min(new * 2 ^ both, distinct)
for _, h in ipairs(hashes) do
  if tonumber(h) % (2 ^ hlevel) == 0 then
    redis.call('ZADD', KEYS[3], ARGV[1], h)
  end
end
local cap = tonumber(ARGV[4])
while redis.call('ZCARD', KEYS[3]) > cap do
  hlevel = hlevel + 1
  for _, h in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
    if tonumber(h) % (2 ^ hlevel) ~= 0 then
      redis.call('ZREM', KEYS[3], h)
    end
  end
end
redis.call('SET', KEYS[4], hlevel, 'PX', ARGV[3])
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
end
redis.call('HSET', KEYS[5], 'distinct', distinct, 'new', new)
redis.call('PEXPIRE', KEYS[5], ARGV[5])
return {distinct, new}
