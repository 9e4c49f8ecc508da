-- Fixed window; mirrors src/algorithm/fixed_window.rs.
-- State: the count of the current window as a string; the key expires at the window's end,
-- so an existing key always belongs to the window containing `now`.
-- Returns allowed, remaining, reset_after, retry_after (-1: none), next state, expiry (ms).
local function fixed_window(raw, limit, window, burst, now, hits, guard)
  local start = now - (now % window)
  local count = tonumber(raw) or 0
  local reset = start + window - now
  local expiry = (start + window) / 1000
  if hits < 0 then
    if guard >= 0 and guard ~= start then
      return true, math.max(limit - count, 0), reset, -1, tostring(count), expiry
    end
    local after = math.max(count + hits, 0)
    return true, math.max(limit - after, 0), reset, -1, tostring(after), expiry
  end
  if limit > 0 and count + hits <= limit then
    local after = count + hits
    return true, limit - after, reset, -1, tostring(after), expiry
  end
  local retry = -1
  if limit > 0 and hits <= limit then retry = reset end
  return false, math.max(limit - count, 0), reset, retry, nil, expiry
end
