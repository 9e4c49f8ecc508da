-- Sluice: leased quota (docs/configuration/leased-quota.md); the driver, after the algorithms above.
-- Mirrors algorithm::lease in src/algorithm/mod.rs and MemoryStore's leases. An instance takes
-- a block of units from a counter at once (a charge of many hits, of at most what is left),
-- admits from it in memory, and hands back what it did not use.
--
-- The learning rule: the last key holds the store's epoch, "born hold_until" (µs), written
-- by the first call that finds it missing (the store is new, or was wiped: flushed, restarted
-- empty), after every epoch a block of that call reports. Every answer carries it, and each block remembers the epoch its units came from.
-- A block of an older epoch reports what it admitted since its last call: those units were
-- counted only in the erased count, so they are charged (past the limit if need be: they
-- were admitted), and its hand-back is ignored (its units died with the count). A block of
-- an older epoch seen within `hold` of the epoch's birth means the store was wiped under
-- blocks: nothing is granted until `born + hold`, by when each of them must have reported.
--
-- KEYS     one counter per ask (a key may repeat: each ask sees the ones before it), then one
--          key per ask where its asker's last grant on the counter is kept for a retry
--          (unused without an ask id), then the epoch key
-- ARGV[1]  the time in microseconds, or 0 for Redis's TIME (tests pin the clock)
-- ARGV[..] fourteen values per ask: algorithm (1 fixed_window, 2 sliding_window, 3 token_bucket,
--          4 concurrency), limit, window (µs), burst, want (the most units to take; negative:
--          that many units handed back; 0 with need 0: only the report), need (the fewest
--          worth taking), instances (those sharing the counter recently), guard (for a
--          hand-back: what the counter must still be at, or it is left alone: the window
--          start it must still be in; for a token bucket, the arrival time the lease left,
--          within a microsecond: tokens go back only while no charge came after them), epoch
--          (of the block's units; 0: none), admitted (units the block admitted since its last
--          call), hold (µs), not after (for a lease: the time after which nothing is granted,
--          its asker having given up; 0: none), ask id (for a lease: which ask of its asker,
--          0: none; a retry with the id kept gets what the first got: "seq units at reset
--          until"), window start (a fixed window's the ask is for, decided as at its start;
--          0: the current one)
-- Returns  {now, epoch, then per ask: units taken (for a hand-back: units handed back), 1 if
--          the ask's need is admitted (else 0), remaining, reset_after, retry_after (-1:
--          none), the grant's time (a retry's: the first one's; 0: now)}, times in
--          microseconds
-- The argument layout, defined once in Rust (`mod args` in src/store/redis/lease.rs).
local PER_ASK = 14
local ALGORITHM, LIMIT, WINDOW, BURST, WANT, NEED, INSTANCES, GUARD = 0, 1, 2, 3, 4, 5, 6, 7
local EPOCH, ADMITTED, HOLD, NOT_AFTER, SEQ, START = 8, 9, 10, 11, 12, 13
-- How long an asker's last grant is kept for its retry (ms; `ASK_KEPT` in Rust).
local ASK_KEPT_MS = 60000
local TOKEN_BUCKET, CONCURRENCY = 3, 4

local asks = (#KEYS - 1) / 2
local epoch_key = KEYS[#KEYS]
local born, hold_until = 0, 0
local raw_epoch = redis.call('GET', epoch_key)
if raw_epoch then
  local b, h = match(raw_epoch, '^(%d+) (%d+)$')
  born, hold_until = tonumber(b) or 0, tonumber(h) or 0
end
local epoch_changed = born == 0
if born == 0 then
  -- A new epoch, after every epoch a block reports (a clock that stepped back, or a wipe
  -- within the microsecond of the last epoch's start, must not look like it).
  born = now
  for k = 1, asks do
    born = max(born, tonumber(ARGV[2 + (k - 1) * PER_ASK + EPOCH]) + 1)
  end
end
for k = 1, asks do
  local a = 2 + (k - 1) * PER_ASK
  local epoch, hold = tonumber(ARGV[a + EPOCH]), tonumber(ARGV[a + HOLD])
  if epoch ~= 0 and epoch ~= born and now < born + hold and hold_until < born + hold then
    hold_until = born + hold
    epoch_changed = true
  end
end
if epoch_changed then
  redis.call('SET', epoch_key, format('%d %d', born, hold_until))
end

local out, o = { now, born }, 2
local current = {}
for k = 1, asks do
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
  local seq, at = tonumber(ARGV[a + SEQ]), 0
  local replay = nil
  if want > 0 and seq > 0 then
    -- A retry of an ask already granted (its reply lost): what it got, once.
    local raw = redis.call('GET', KEYS[asks + k])
    if raw then
      local s, u, t, r, untl = match(raw, '^(%d+) (%d+) (%d+) (%d+) (%d+)$')
      if s and tonumber(s) == seq and now < tonumber(untl) then
        replay = { tonumber(u), tonumber(t), tonumber(r) }
      end
    end
  end
  if replay then
    local _
    _, remaining = step(st, limit, window, burst, now, 0, -1)
    units, allowed, reset, retry, at = replay[1], replay[1] > 0, replay[3], -1, replay[2]
    next_state = nil
  else
    local epoch, admitted = tonumber(ARGV[a + EPOCH]), safe(tonumber(ARGV[a + ADMITTED]))
    local older = epoch ~= 0 and epoch ~= born
    if older and admitted > 0 then
      -- Admitted from units of an older epoch: charged, past the limit if need be.
      local _, _, _, _, charged, charged_expires = step(
        st, limit, window, burst, now, admitted, -1, true)
      if charged then
        st = charged
        redis.call('SET', key, encoders[algorithm](charged), 'PXAT', ceil(charged_expires))
      end
    end
    -- An ask for a given window (a fixed window's start): decided as at its start, nothing
    -- once it is over.
    local start = tonumber(ARGV[a + START])
    local t = max(now, start)
    if start > 0 and now >= start + window then
      units, allowed, retry = 0, false, -1
      local _
      _, remaining, reset = step(st, limit, window, burst, now, 0, -1)
      next_state = nil
    elseif want == 0 and tonumber(ARGV[a + NEED]) == 0 or want < 0 and older then
      -- Only the report; or a hand-back of units that died with their epoch.
      units = 0
      allowed, remaining, reset, retry = step(st, limit, window, burst, now, 0, -1)
      next_state = nil
    elseif want > 0 and tonumber(ARGV[a + NOT_AFTER]) > 0 and now > tonumber(ARGV[a + NOT_AFTER]) then
      -- Too late: its asker has given up waiting (an ask held by a partition): nothing taken.
      units, allowed, retry = 0, false, -1
      local _
      _, remaining, reset = step(st, limit, window, burst, now, 0, -1)
      next_state = nil
    elseif want > 0 and now < hold_until then
      -- The store was wiped under blocks that have not all reported: nothing is granted.
      units, allowed = 0, false
      local _
      _, remaining, reset = step(st, limit, window, burst, now, 0, -1)
      retry = hold_until - now
      next_state = nil
    elseif want < 0 then
      -- A hand-back, if the counter is still as the lease left it (mirrors
      -- LeaseAsk::give_back_hits): in the lease's window; a token bucket at the arrival time
      -- the lease left, within a microsecond.
      local guard, intact = tonumber(ARGV[a + GUARD]), false
      if algorithm == TOKEN_BUCKET then
        intact = st and math.abs(st[1] - guard) <= 1
      else
        intact = t - (t % window) == guard
      end
      units = 0
      if intact then
        allowed, remaining, reset, retry, next_state, expires = step(
          st, limit, window, burst, t, want, -1)
        units = -want
      else
        allowed, remaining, reset, retry = step(st, limit, window, burst, t, 0, -1)
        next_state = nil
      end
    else
      -- What the counter would still admit; a block is at most a share of it.
      local ok, left = step(st, limit, window, burst, t, 0, -1)
      if not ok then left = 0 end
      local block = need
      if algorithm ~= CONCURRENCY and left >= need then
        local share = floor(left / (2 * max(tonumber(ARGV[a + INSTANCES]), 1)))
        block = min(max(min(want, share), need), left)
      end
      allowed, remaining, reset, retry, next_state, expires = step(
        st, limit, window, burst, t, block, -1)
      if not allowed and block > need then
        -- A fractional estimate that the whole block just misses: the need decides.
        block = need
        allowed, remaining, reset, retry, next_state, expires = step(
          st, limit, window, burst, t, block, -1)
      end
      units = allowed and block or 0
      if not allowed then next_state = nil end
    end
    if want > 0 and seq > 0 then
      redis.call('SET', KEYS[asks + k], format('%d %d %d %d %d', seq, units, now,
        max(safe(reset), 0), now + ASK_KEPT_MS * 1000), 'PX', ASK_KEPT_MS)
    end
  end
  if next_state then
    current[key] = next_state
    redis.call('SET', key, encoders[algorithm](next_state), 'PXAT', ceil(expires))
  else
    current[key] = st
  end
  out[o + 1], out[o + 2], out[o + 3] = units, allowed and 1 or 0, max(safe(remaining), 0)
  out[o + 4], out[o + 5], out[o + 6] = max(safe(reset), 0), max(safe(retry), -1), at
  o = o + 6
end
return out
