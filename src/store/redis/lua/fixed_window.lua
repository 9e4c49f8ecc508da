-- Fixed window; mirrors src/algorithm/fixed_window.rs.
-- Stored as "start count": the window the count belongs to and the count; the key expires at
-- that window's end. (The start is kept, not implied by the expiry, because Redis expires
-- keys with millisecond precision and lazily: a key may outlive its window by a moment.)
-- Decoded once per call into {start, count}; the step returns allowed, remaining,
-- reset_after, retry_after (-1: none), the next state (nil: unchanged) and its expiry (ms).
-- A usage budget (`overdraft`) needs room for at least one hit and records a refused charge.
local function fixed_window_decode(raw)
  local s, c = match(raw, '^(%d+) (%d+)$')
  if s then return { safe(tonumber(s)), count_parse(c) } end
end

local function fixed_window_encode(st)
  return format('%d %s', max(safe(st[1]), 0), count_format(st[2]))
end

local function fixed_window(st, limit, window, burst, now, hits, guard, overdraft)
  local start = now - (now % window)
  local ws, count = start, 0
  -- A later stored window means the clock stepped back: keep counting in it.
  if st and st[1] >= start then ws, count = st[1], st[2] end
  local used = count_value(count)
  local reset = max(ws + window - now, 0)
  local expiry = (ws + window) / 1000
  if hits < 0 then
    if guard >= 0 and guard ~= ws then
      return true, max(limit - used, 0), reset, -1, { ws, count }, expiry
    end
    local after = count_add(count, hits)
    return true, max(limit - count_value(after), 0), reset, -1, { ws, after }, expiry
  end
  local room = hits
  if overdraft and room < 1 then room = 1 end
  if limit > 0 and used + room <= limit then
    local after = used + hits
    return true, limit - after, reset, -1, { ws, after }, expiry
  end
  local retry = -1
  if limit > 0 and hits <= limit then retry = reset end
  if overdraft then
    local after = count
    if hits > 0 then after = count_add(count, hits) end
    return false, 0, reset, retry, hits > 0 and { ws, after } or nil, expiry,
      count_add(after, -limit)
  end
  return false, max(limit - used, 0), reset, retry, nil, expiry
end

-- The same window in the reference's layout (REDIS_KEY_FORMAT=reference, counter script
-- only): Sluice names the window in the key (`..._<window start>`, from its own clock as the
-- reference does), and the value is a plain integer that the reference's INCRBY charges
-- too. The burst slot carries the expiry in seconds (the unit plus jitter), counted from
-- now on every write as the reference's EXPIRE does.
local function reference_window_decode(raw)
  local c = match(raw, '^(%d+)$')
  if c then return { 0, count_parse(c) } end
end

local function reference_window_encode(st)
  return count_format(st[2])
end

local function reference_window(st, limit, window, ttl, now, hits, guard, overdraft)
  local start = now - (now % window)
  local allowed, remaining, reset, retry, next_state, _, over = fixed_window(
    st and { start, st[2] } or false, limit, window, 0, now, hits, guard, overdraft)
  return allowed, remaining, reset, retry, next_state, now / 1000 + ttl * 1000, over
end
