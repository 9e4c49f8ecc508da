-- Sluice: decide and charge one request's counters atomically (DESIGN §4-§5); the driver,
-- after one function per algorithm above. Mirrors src/store/batch.rs and the memory store.
--
-- Why Lua: reading the counters, deciding and writing must be one atomic step per request
-- (a rejected request charges nothing), without WATCH/MULTI round trips and retries; and the
-- script reads Redis's own clock (TIME), so every Sluice instance agrees on time.
--
-- KEYS[i]  counter i: one string key per counter, expiring when its state equals no state
-- ARGV[1]  "1": admit whatever the decisions (global shadow mode); "0": the usual rule
-- ARGV[2]  the time in microseconds, or 0 for Redis's TIME (tests pin the clock)
-- ARGV[..] seven values per counter: algorithm (1 fixed_window, 2 sliding_window,
--          3 token_bucket, 4 concurrency), limit, window (µs), burst, hits (negative: refund),
--          role (0 enforce, 1 shadow, 2 quota), guard (window start a refund must still be
--          in, or -1)
-- Returns  {admitted, now, then per counter: allowed, remaining, reset_after, retry_after}
--          with times in microseconds and retry_after -1 when there is none
local algorithms = { fixed_window, sliding_window, token_bucket, concurrency }

local now = tonumber(ARGV[2])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local stored = redis.call('MGET', unpack(KEYS))

local function arg(i, field)
  return tonumber(ARGV[2 + (i - 1) * 7 + field])
end

-- Mirrors algorithm::applies_unconditionally: refunds, and concurrency acquisitions.
local function unconditional(i)
  local hits = arg(i, 5)
  return hits < 0 or (hits > 0 and arg(i, 1) == 4)
end

-- Runs counter i on top of this request's earlier states (two descriptors may share one).
local function run(i, states)
  local raw = states[KEYS[i]]
  if raw == nil then raw = stored[i] or nil end
  if raw == false then raw = nil end
  local decide = algorithms[arg(i, 1)]
  return decide(raw, arg(i, 2), arg(i, 3), arg(i, 4), now, arg(i, 5), arg(i, 7))
end

local out = {0, now}
local states, expiry = {}, {}
local enforce_over, quota_seen, quota_all_over = false, false, true
for i = 1, #KEYS do
  local allowed, remaining, reset, retry, next_state, expires = run(i, states)
  if ((allowed and arg(i, 5) ~= 0) or unconditional(i)) and next_state then
    states[KEYS[i]] = next_state
    expiry[KEYS[i]] = expires
  end
  local role = arg(i, 6)
  if role == 0 and not allowed then enforce_over = true end
  if role == 2 then
    quota_seen = true
    if allowed then quota_all_over = false end
  end
  local base = 2 + (i - 1) * 4
  out[base + 1] = allowed and 1 or 0
  out[base + 2] = remaining
  out[base + 3] = reset
  out[base + 4] = retry
end

local admitted = ARGV[1] == '1' or not (enforce_over or (quota_seen and quota_all_over))
if admitted then
  out[1] = 1
else
  -- Nothing is charged, but refunds still return what earlier requests took (and
  -- concurrency acquisitions count: their releases will come).
  states, expiry = {}, {}
  for i = 1, #KEYS do
    if unconditional(i) then
      local _, _, _, _, next_state, expires = run(i, states)
      states[KEYS[i]] = next_state
      expiry[KEYS[i]] = expires
    end
  end
end
for key, state in pairs(states) do
  redis.call('SET', key, state, 'PXAT', string.format('%d', math.ceil(expiry[key])))
end
return out
