-- Adds the hashes of keys a rule refused in one window to its set (src/store/refused.rs).
-- KEYS[1]: the window's set; KEYS[2]: its sampling level. ARGV[1]: time to live (ms);
-- ARGV[2]: the most hashes the set keeps; ARGV[3]: the level the sender sampled at (the
-- set's becomes at least that); ARGV[4..]: the hashes (integers below 2^52).
-- Past the cap the set keeps only hashes whose low `level` bits are zero, one more bit each
-- time it overflows. Answers the level.
local level = tonumber(redis.call('GET', KEYS[2]) or '0')
local cap = tonumber(ARGV[2])
local raised = false
if tonumber(ARGV[3]) > level then
  level = tonumber(ARGV[3])
  raised = true
end
local step = 2 ^ level
if raised then
  for _, h in ipairs(redis.call('SMEMBERS', KEYS[1])) do
    if tonumber(h) % step ~= 0 then
      redis.call('SREM', KEYS[1], h)
    end
  end
end
for i = 4, #ARGV do
  if tonumber(ARGV[i]) % step == 0 then
    redis.call('SADD', KEYS[1], ARGV[i])
  end
end
while redis.call('SCARD', KEYS[1]) > cap do
  level = level + 1
  step = 2 ^ level
  for _, h in ipairs(redis.call('SMEMBERS', KEYS[1])) do
    if tonumber(h) % step ~= 0 then
      redis.call('SREM', KEYS[1], h)
    end
  end
end
redis.call('SET', KEYS[2], level, 'PX', ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return level
