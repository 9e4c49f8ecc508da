-- Sluice: decide and charge the counters of one or more requests atomically (DESIGN §4-§5);
-- the driver, after one function per algorithm above. Mirrors src/store/batch.rs and the
-- memory store. Requests are applied one after the other, each all-or-nothing, each seeing
-- what the requests before it charged: the same answers as one call per request, for a
-- fraction of the cost (Sluice sends the requests that arrive while a call is in flight
-- together in the next).
--
-- Why Lua: reading the counters, deciding and writing must be one atomic step per request
-- (a rejected request charges nothing), without WATCH/MULTI round trips and retries; and the
-- script reads Redis's own clock (TIME), so every Sluice instance agrees on time.
--
-- KEYS     the counters of every request, in order: one string key per counter, expiring
--          when its state equals no state
-- ARGV[1]  the time in microseconds, or 0 for Redis's TIME (tests pin the clock)
-- ARGV[..] per request: "1" to admit whatever the decisions (global shadow mode) or "0" for
--          the usual rule; its number of counters; then seven values per counter: algorithm
--          (1 fixed_window, 2 sliding_window, 3 token_bucket, 4 concurrency), limit,
--          window (µs), burst, hits (negative: refund), role (0 enforce, 1 shadow,
--          2 quota), guard (window start a refund must still be in, or -1)
-- Returns  {now, then per request: admitted, then per counter: allowed, remaining,
--          reset_after, retry_after}, times in microseconds, retry_after -1 when there is none
local algorithms = { fixed_window, sliding_window, token_bucket, concurrency }

local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local stored = redis.call('MGET', unpack(KEYS))
-- What the requests already applied by this call charged, by key.
local committed, committed_expiry = {}, {}
local out = { now }

-- Runs the counter at KEYS[k], whose seven values start at ARGV[a], on top of `states` (this
-- request's earlier charges: two descriptors may share a counter), then of the earlier
-- requests' charges. Returns the algorithm's answer, and whether the charge applies
-- unconditionally (mirrors algorithm::applies_unconditionally: refunds, and concurrency
-- acquisitions).
local function run(k, a, states)
  local key = KEYS[k]
  local raw = states[key]
  if raw == nil then raw = committed[key] end
  if raw == nil then raw = stored[k] end
  if raw == false then raw = nil end
  local algorithm, hits = tonumber(ARGV[a]), tonumber(ARGV[a + 4])
  local allowed, remaining, reset, retry, next_state, expires = algorithms[algorithm](
    raw, tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), now, hits,
    tonumber(ARGV[a + 6]))
  local unconditional = hits < 0 or (hits > 0 and algorithm == 4)
  return allowed, remaining, reset, retry, next_state, expires, hits, unconditional
end

local at, first_key = 2, 0
while at <= #ARGV do
  local always = ARGV[at] == '1'
  local n = tonumber(ARGV[at + 1])
  local states, expiry = {}, {}
  local enforce_over, quota_seen, quota_all_over = false, false, true
  local admitted_at = #out + 1
  out[admitted_at] = 0
  for i = 1, n do
    local k, a = first_key + i, at + 2 + (i - 1) * 7
    local allowed, remaining, reset, retry, next_state, expires, hits, unconditional =
      run(k, a, states)
    if ((allowed and hits ~= 0) or unconditional) and next_state then
      states[KEYS[k]] = next_state
      expiry[KEYS[k]] = expires
    end
    local role = ARGV[a + 5]
    if role == '0' and not allowed then enforce_over = true end
    if role == '2' then
      quota_seen = true
      if allowed then quota_all_over = false end
    end
    local o = #out
    out[o + 1] = allowed and 1 or 0
    out[o + 2] = remaining
    out[o + 3] = reset
    out[o + 4] = retry
  end

  if always or not (enforce_over or (quota_seen and quota_all_over)) then
    out[admitted_at] = 1
  else
    -- Nothing is charged, but refunds still return what earlier requests took (and
    -- concurrency acquisitions count: their releases will come).
    states, expiry = {}, {}
    for i = 1, n do
      local k, a = first_key + i, at + 2 + (i - 1) * 7
      local hits = tonumber(ARGV[a + 4])
      if hits < 0 or (hits > 0 and ARGV[a] == '4') then
        local _, _, _, _, next_state, expires = run(k, a, states)
        states[KEYS[k]] = next_state
        expiry[KEYS[k]] = expires
      end
    end
  end
  for key, state in pairs(states) do
    committed[key] = state
    committed_expiry[key] = expiry[key]
  end
  at = at + 2 + 7 * n
  first_key = first_key + n
end

for key, state in pairs(committed) do
  redis.call('SET', key, state, 'PXAT', math.ceil(committed_expiry[key]))
end
return out
