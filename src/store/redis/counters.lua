-- Sluice: decide and charge one request's counters atomically (DESIGN §4-§5).
--
-- Why Lua: reading the counters, deciding and writing must be one atomic step per request
-- (all-or-nothing: a rejected request charges nothing), without WATCH/MULTI round trips and
-- retries; and the script reads Redis's own clock (TIME), so every Sluice instance agrees on
-- the window. It mirrors src/algorithm/fixed_window.rs and src/store/batch.rs line by line.
--
-- KEYS[i]  counter i: a string holding the count of the current window, expiring at the
--          window's end (an absent key is an empty window)
-- ARGV[1]  "1": admit whatever the decisions (global shadow mode); "0": the usual rule
-- ARGV[..] five values per counter: limit, window (microseconds), hits (negative: refund),
--          role ("0" enforce, "1" shadow, "2" quota), guard (window start a refund must
--          still be in, or -1 for none)
-- Returns  {admitted, now, then per counter: allowed, remaining, reset_after, retry_after}
--          with times in microseconds and retry_after -1 when there is none
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local always = ARGV[1] == '1'
local n = #KEYS
local stored = redis.call('MGET', unpack(KEYS))

local function arg(i, field)
  return tonumber(ARGV[1 + (i - 1) * 5 + field])
end

-- Applies counter i on top of `counts` (key -> count); returns allowed, count before, after.
local function apply(i, counts)
  local limit, window, hits = arg(i, 1), arg(i, 2), arg(i, 3)
  local start = now - (now % window)
  local count = counts[KEYS[i]]
  if count == nil then count = tonumber(stored[i]) or 0 end
  if hits < 0 then
    local guard = arg(i, 5)
    if guard < 0 or guard == start then
      return true, count, math.max(count + hits, 0)
    end
    return true, count, count
  end
  if limit > 0 and count + hits <= limit then
    return true, count, count + hits
  end
  return false, count, count
end

local out = {0, now}
local counts, expiry = {}, {}
local enforce_over, quota_seen, quota_all_over = false, false, true
for i = 1, n do
  local limit, window, hits, role = arg(i, 1), arg(i, 2), arg(i, 3), ARGV[1 + (i - 1) * 5 + 4]
  local allowed, before, after = apply(i, counts)
  local start = now - (now % window)
  local reset = start + window - now
  local remaining, retry = math.max(limit - after, 0), -1
  if allowed then
    if hits ~= 0 then
      counts[KEYS[i]] = after
      expiry[KEYS[i]] = (start + window) / 1000
    end
  else
    remaining = math.max(limit - before, 0)
    if hits <= limit and limit > 0 then retry = reset end
  end
  if role == '0' and not allowed then enforce_over = true end
  if role == '2' then
    quota_seen = true
    if allowed then quota_all_over = false end
  end
  local base = 2 + (i - 1) * 4
  out[base + 1] = allowed and 1 or 0
  out[base + 2] = remaining
  out[base + 3] = reset
  out[base + 4] = retry
end

local admitted = always or not (enforce_over or (quota_seen and quota_all_over))
if admitted then
  out[1] = 1
else
  -- Nothing is charged, but refunds still return what earlier requests took.
  counts, expiry = {}, {}
  for i = 1, n do
    local hits, window = arg(i, 3), arg(i, 2)
    if hits < 0 then
      local _, _, after = apply(i, counts)
      counts[KEYS[i]] = after
      expiry[KEYS[i]] = (now - (now % window) + window) / 1000
    end
  end
end
for key, count in pairs(counts) do
  redis.call('SET', key, count, 'PXAT', expiry[key])
end
return out
