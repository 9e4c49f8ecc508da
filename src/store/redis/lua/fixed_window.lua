-- Fixed window; mirrors src/algorithm/fixed_window.rs.
-- State: "start count", the window the count belongs to and the count; the key expires at
-- that window's end. (The start is kept, not implied by the expiry, because Redis expires
-- keys with millisecond precision and lazily: a key may outlive its window by a moment.)
-- Returns allowed, remaining, reset_after, retry_after (-1: none), next state, expiry (ms).
local function fixed_window(raw, limit, window, burst, now, hits, guard)
  local start = now - (now % window)
  local ws, count = start, 0
  if raw then
    local s, c = string.match(raw, '^(%d+) (%d+)$')
    s, c = tonumber(s), tonumber(c)
    -- A later stored window means the clock stepped back: keep counting in it.
    if s >= start then ws, count = s, c end
  end
  local reset = math.max(ws + window - now, 0)
  local expiry = (ws + window) / 1000
  local function state(c)
    return string.format('%d %d', ws, c)
  end
  if hits < 0 then
    if guard >= 0 and guard ~= ws then
      return true, math.max(limit - count, 0), reset, -1, state(count), expiry
    end
    local after = math.max(count + hits, 0)
    return true, math.max(limit - after, 0), reset, -1, state(after), expiry
  end
  if limit > 0 and count + hits <= limit then
    local after = count + hits
    return true, limit - after, reset, -1, state(after), expiry
  end
  local retry = -1
  if limit > 0 and hits <= limit then retry = reset end
  return false, math.max(limit - count, 0), reset, retry, nil, expiry
end
