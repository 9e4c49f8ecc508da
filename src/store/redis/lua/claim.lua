-- RLQS claims on shared budgets (src/store/redis/claim.rs). KEYS: the budgets' hashes.
-- ARGV[1]: the instance; then per key its total, want, demand (requests per window, in
-- thousandths), ttl (ms) and peers. For each key: drops the claims that ended, grants at
-- most what the others leave, records this instance's claim and peers; answers five
-- integers per key: granted, the others' demand, how many others, what they hold, their
-- peers (an instance that names none counted as one). One script: reading the others and
-- writing ours must be one step, or two instances could each take what the other left.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me = ARGV[1]
local out = {}
for k = 1, #KEYS do
  local base = 1 + (k - 1) * 5
  local total, want = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
  local mine, ttl = tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4])
  local peers = tonumber(ARGV[base + 5])
  local held, demand, count, named, named_peers = 0, 0, 0, 0, 0
  local fields = redis.call('HGETALL', KEYS[k])
  for i = 1, #fields, 2 do
    local field = fields[i]
    if string.sub(field, -6) == '#peers' then
      if field ~= me .. '#peers' then
        local p, e = string.match(fields[i + 1], '^(%d+):(%d+)$')
        if p == nil or tonumber(e) <= now then
          redis.call('HDEL', KEYS[k], field)
        else
          named = named + 1
          named_peers = named_peers + tonumber(p)
        end
      end
    elseif field ~= me then
      local c, d, e = string.match(fields[i + 1], '^(%d+):(%d+):(%d+)$')
      if c == nil or tonumber(e) <= now then
        redis.call('HDEL', KEYS[k], field)
      else
        held = held + tonumber(c)
        demand = demand + tonumber(d)
        count = count + 1
      end
    end
  end
  local granted = math.min(want, math.max(0, total - held))
  redis.call('HSET', KEYS[k], me, string.format('%d:%d:%d', granted, mine, now + ttl),
    me .. '#peers', string.format('%d:%d', peers, now + ttl))
  redis.call('PEXPIRE', KEYS[k], ttl * 2)
  out[#out + 1] = granted
  out[#out + 1] = demand
  out[#out + 1] = count
  out[#out + 1] = held
  out[#out + 1] = named_peers + math.max(0, count - named)
end
return out
