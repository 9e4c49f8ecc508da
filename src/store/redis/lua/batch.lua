-- Sluice: decide and charge the counters of one or more requests atomically (DESIGN §4-§5);
-- the driver, after the algorithms above. Mirrors src/store/batch.rs and the memory store.
-- Requests are applied one after the other, each all-or-nothing, each seeing what the
-- requests before it charged: the same answers as one call per request, for a fraction of
-- the cost (Sluice sends the requests that arrive while a call is in flight together in the
-- next). Each key's stored state is decoded once per call and written once at its end,
-- however many requests of the call charge it.
--
-- Why Lua: reading the counters, deciding and writing must be one atomic step per request
-- (a rejected request charges nothing), without WATCH/MULTI round trips and retries; and the
-- script reads Redis's own clock (TIME), so every Sluice instance agrees on time.
--
-- KEYS     the counters of every request, in order: one string key per counter, expiring
--          when its state equals no state
-- ARGV[1]  the time in microseconds, or 0 for Redis's TIME (tests pin the clock)
-- ARGV[..] per request: its admission ("0" the usual rule, "1" whatever the decisions for
--          the global shadow mode, "2" never, to read the statuses of a request already
--          rejected; mirrors store::Admission); its number of counters; then seven values per
--          counter: algorithm (1 fixed_window, 2 sliding_window, 3 token_bucket, 4
--          concurrency, 5 reference layout fixed window; plus 16 for a usage budget, whose
--          charges are recorded even when refused), limit, window (µs), burst (5: expiry in
--          s), hits (negative: refund), role (0 enforce, 1 shadow, 2 quota), guard (window
--          start a refund must still be in, or -1)
-- Returns  {now, then per request: a header (1 if admitted, else 0, plus twice the number
--          of values that follow for this request), then per counter: remaining and
--          reset_after when allowed, or -1 - remaining, reset_after and retry_after (-1:
--          none) when not, and for a usage budget then its overdraft (the units past its
--          limit) as two integers, hi and lo, worth hi * 1e9 + lo}, times in microseconds (an allowed counter has no retry_after:
--          a shorter answer is less for Redis to write and Sluice to read)
-- The argument layout, defined once in Rust (`mod args` in src/store/redis/mod.rs): the same
-- names, offsets from a counter's first value, and codes.
local HEADER, PER_COUNTER = 2, 7
local ALGORITHM, LIMIT, WINDOW, BURST, HITS, ROLE, GUARD = 0, 1, 2, 3, 4, 5, 6
local ADMIT_ALWAYS, ADMIT_NEVER = '1', '2'
local CONCURRENCY, OVERDRAFT = 4, 16

-- Mirrors algorithm::applies_unconditionally: refunds, concurrency acquisitions and usage
-- budgets' charges change their counter whatever the decisions.
local function unconditional(code, hits)
  return hits < 0 or (hits > 0 and (code % OVERDRAFT == CONCURRENCY or code >= OVERDRAFT))
end
local ROLE_ENFORCE, ROLE_QUOTA = '0', '2'

-- Every distinct key read once (under load, many requests of a call share hot keys).
local slot_of, distinct = {}, {}
for k = 1, #KEYS do
  local key = KEYS[k]
  if not slot_of[key] then
    distinct[#distinct + 1] = key
    slot_of[key] = #distinct
  end
end
if #distinct == 0 then return { now } end -- a probe: no counters
local stored = redis.call('MGET', unpack(distinct))
-- Each key's state after the requests applied so far (false: none), decoded on first use
-- (an unreadable value counts as none); and, for the keys to write, the algorithm and the
-- expiry (ms) of their last charge.
local current, algorithm_of, expiry_of = {}, {}, {}
local out, o = { now }, 1
-- The current request's charges, by key: the latest state charged, its algorithm and its
-- expiry. A counter sees the latest charge of an earlier counter of the same request on the
-- same key (two descriptors may share a counter), then what earlier requests charged, then
-- Redis. A table by key, so a wide request costs linear time, not quadratic.
local pending_state, pending_expiry, pending_algorithm = {}, {}, {}

-- Decides the counter at KEYS[k] (seven values from ARGV[a]). Returns the algorithm's answer.
local function run(k, a)
  local key = KEYS[k]
  local code = tonumber(ARGV[a + ALGORITHM])
  local algorithm, overdraft = code % OVERDRAFT, code >= OVERDRAFT
  local st = pending_state[key]
  if st == nil then
    st = current[key]
    if st == nil then
      local raw = stored[slot_of[key]]
      st = raw and decoders[algorithm](raw) or false
      current[key] = st
    end
  end
  local hits = safe(tonumber(ARGV[a + HITS]))
  local allowed, remaining, reset, retry, next_state, expires, over = steps[algorithm](
    st, tonumber(ARGV[a + LIMIT]), tonumber(ARGV[a + WINDOW]), tonumber(ARGV[a + BURST]), now,
    hits, tonumber(ARGV[a + GUARD]), overdraft)
  if ((allowed and hits ~= 0) or unconditional(code, hits)) and next_state then
    pending_state[key] = next_state
    pending_algorithm[key] = algorithm
    pending_expiry[key] = expires
  end
  if overdraft and over == nil then over = 0 end
  return allowed, max(safe(remaining), 0), max(safe(reset), 0), max(safe(retry), -1), over
end

local at, first_key = 2, 0
while at <= #ARGV do
  local always, never = ARGV[at] == ADMIT_ALWAYS, ARGV[at] == ADMIT_NEVER
  local n = tonumber(ARGV[at + 1])
  local enforce_over, quota_seen, quota_all_over = false, false, true
  o = o + 1
  local admitted_at = o
  out[o] = 0
  for i = 1, n do
    local k, a = first_key + i, at + HEADER + (i - 1) * PER_COUNTER
    local allowed, remaining, reset, retry, over = run(k, a)
    local role = ARGV[a + ROLE]
    if role == ROLE_ENFORCE and not allowed then enforce_over = true end
    if role == ROLE_QUOTA then
      quota_seen = true
      if allowed then quota_all_over = false end
    end
    if allowed then
      out[o + 1], out[o + 2] = remaining, reset
      o = o + 2
    else
      out[o + 1], out[o + 2], out[o + 3] = -1 - remaining, reset, retry
      o = o + 3
      -- A usage budget's overdraft (units past its limit, exact however large).
      if over ~= nil then
        out[o + 1], out[o + 2] = count_parts(over)
        o = o + 2
      end
    end
  end

  local admitted = always or not (never or enforce_over or (quota_seen and quota_all_over))
  if not admitted then
    -- Nothing is charged, but refunds still return what earlier requests took (and
    -- concurrency acquisitions and usage budgets' charges count).
    pending_state, pending_expiry, pending_algorithm = {}, {}, {}
    for i = 1, n do
      local k, a = first_key + i, at + HEADER + (i - 1) * PER_COUNTER
      if unconditional(tonumber(ARGV[a + ALGORITHM]), tonumber(ARGV[a + HITS])) then
        run(k, a)
      end
    end
  end
  if next(pending_state) then
    for key, st in pairs(pending_state) do
      current[key] = st
      algorithm_of[key] = pending_algorithm[key]
      expiry_of[key] = pending_expiry[key]
    end
    pending_state, pending_expiry, pending_algorithm = {}, {}, {}
  end
  -- The request's header: admitted, and how many values follow, so that Sluice can read
  -- each request's answer on its own.
  out[admitted_at] = (admitted and 1 or 0) + 2 * (o - admitted_at)
  at = at + HEADER + PER_COUNTER * n
  first_key = first_key + n
end

for key, expiry in pairs(expiry_of) do
  redis.call('SET', key, encoders[algorithm_of[key]](current[key]), 'PXAT', ceil(expiry))
end
return out
