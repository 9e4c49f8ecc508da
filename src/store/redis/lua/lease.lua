-- Sluice: leased quota (docs/configuration/leased-quota.md); the driver, after the algorithms above.
-- Mirrors algorithm::lease in src/algorithm/mod.rs and MemoryStore's leases. An instance takes
-- a block of units from a counter at once (a charge of many hits, of at most what is left),
-- admits from it in memory, and hands back what it did not use.
--
-- KEYS     one counter per ask (a key may repeat: each ask sees the ones before it)
-- ARGV[1]  the time in microseconds, or 0 for Redis's TIME (tests pin the clock)
-- ARGV[..] eight values per ask: algorithm (1 fixed_window, 2 sliding_window, 3 token_bucket,
--          4 concurrency), limit, window (µs), burst, want (the most units to take; negative:
--          that many units handed back), need (the fewest worth taking), instances (those
--          sharing the counter recently), guard (for a hand-back: what the counter must
--          still be at, or it is left alone: the window start it must still be in; for a
--          token bucket, the arrival time the lease left, within a microsecond: tokens go
--          back only while no charge came after them)
-- Returns  {now, then per ask: units taken (for a hand-back: units handed back), 1 if the
--          ask's need is admitted (else 0),
--          remaining, reset_after, retry_after (-1: none)}, times in microseconds
-- The argument layout, defined once in Rust (`mod args` in src/store/redis/lease.rs).
local PER_ASK = 8
local ALGORITHM, LIMIT, WINDOW, BURST, WANT, NEED, INSTANCES, GUARD = 0, 1, 2, 3, 4, 5, 6, 7
local TOKEN_BUCKET, CONCURRENCY = 3, 4


local out, o = { now }, 1
local current = {}
for k = 1, #KEYS do
  local key, a = KEYS[k], 2 + (k - 1) * PER_ASK
  local algorithm = tonumber(ARGV[a + ALGORITHM])
  local step = steps[algorithm]
  local limit, window, burst = tonumber(ARGV[a + LIMIT]), tonumber(ARGV[a + WINDOW]),
    tonumber(ARGV[a + BURST])
  local want, need = safe(tonumber(ARGV[a + WANT])), max(safe(tonumber(ARGV[a + NEED])), 1)
  local st = current[key]
  if st == nil then
    local raw = redis.call('GET', key)
    st = raw and decoders[algorithm](raw) or false
  end
  local units, allowed, remaining, reset, retry, next_state, expires
  if want < 0 then
    -- A hand-back, if the counter is still as the lease left it (mirrors
    -- LeaseAsk::give_back_hits): in the lease's window; a token bucket at the arrival time
    -- the lease left, within a microsecond.
    local guard, intact = tonumber(ARGV[a + GUARD]), false
    if algorithm == TOKEN_BUCKET then
      intact = st and math.abs(st[1] - guard) <= 1
    else
      intact = now - (now % window) == guard
    end
    units = 0
    if intact then
      allowed, remaining, reset, retry, next_state, expires = step(
        st, limit, window, burst, now, want, -1)
      units = -want
    else
      allowed, remaining, reset, retry = step(st, limit, window, burst, now, 0, -1)
      next_state = nil
    end
  else
    -- What the counter would still admit; a block is at most a share of it.
    local ok, left = step(st, limit, window, burst, now, 0, -1)
    if not ok then left = 0 end
    local block = need
    if algorithm ~= CONCURRENCY and left >= need then
      local share = floor(left / (2 * max(tonumber(ARGV[a + INSTANCES]), 1)))
      block = min(max(min(want, share), need), left)
    end
    allowed, remaining, reset, retry, next_state, expires = step(
      st, limit, window, burst, now, block, -1)
    if not allowed and block > need then
      -- A fractional estimate that the whole block just misses: the need decides.
      block = need
      allowed, remaining, reset, retry, next_state, expires = step(
        st, limit, window, burst, now, block, -1)
    end
    units = allowed and block or 0
    if not allowed then next_state = nil end
  end
  if next_state then
    current[key] = next_state
    redis.call('SET', key, encoders[algorithm](next_state), 'PXAT', ceil(expires))
  else
    current[key] = st
  end
  out[o + 1], out[o + 2], out[o + 3] = units, allowed and 1 or 0, max(safe(remaining), 0)
  out[o + 4], out[o + 5] = max(safe(reset), 0), max(safe(retry), -1)
  o = o + 5
end
return out
