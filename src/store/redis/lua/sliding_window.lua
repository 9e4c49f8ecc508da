-- Sliding window (weighted two-window counter); mirrors src/algorithm/sliding_window.rs,
-- with the floating point operations in the same order, so both give the same answers.
-- State: "last previous current", the time of the last charge (an earlier `now` is read as
-- it: a clock that steps back neither adds nor removes capacity) and the counts of its window
-- and the one before; the key expires two windows after the start of `last`'s window. (The
-- first version stored that start instead of `last`; it reads the same way.)
local function sliding_window(raw, limit, window, burst, now, hits, guard)
  local s, p, c
  if raw then
    s, p, c = string.match(raw, '^(%d+) (%d+) (%d+)$')
    s, p, c = tonumber(s), tonumber(p), tonumber(c)
    if s > now then now = s end
  end
  local ws = now - (now % window)
  local previous, current = 0, 0
  if raw then
    local stored = s - (s % window)
    if stored == ws then
      previous, current = p, c
    elseif stored + window == ws then
      previous = c
    end
  end
  local elapsed = now - ws
  local function estimate(c)
    return previous * (window - elapsed) / window + c
  end
  local function remaining(c)
    local left = limit - estimate(c)
    if left <= 0 then return 0 end
    return math.floor(left)
  end
  local function full_after(c)
    local until_t = now
    if c > 0 then until_t = ws + 2 * window elseif previous > 0 then until_t = ws + window end
    return math.max(until_t - now, 0)
  end
  local function state(c)
    return string.format('%d %d %d', now, previous, c)
  end
  local expiry = (ws + 2 * window) / 1000
  if hits < 0 then
    if guard >= 0 and guard ~= ws then
      return true, remaining(current), full_after(current), -1, state(current), expiry
    end
    local after = math.max(current + hits, 0)
    return true, remaining(after), full_after(after), -1, state(after), expiry
  end
  if limit > 0 and estimate(current) + hits <= limit then
    local after = current + hits
    return true, remaining(after), full_after(after), -1, state(after), expiry
  end
  local retry = -1
  if limit > 0 and hits <= limit then
    local finish = ws + window
    local t = nil
    if previous > 0 and current + hits <= limit then
      local within = math.ceil(finish - (limit - hits - current) * window / previous)
      if within < finish then t = within end
    end
    if t == nil then
      if current > 0 then
        t = math.max(math.ceil((finish + window) - (limit - hits) * window / current), finish)
      else
        t = finish
      end
    end
    retry = math.max(t - now, 0)
  end
  return false, remaining(current), full_after(current), retry, nil, expiry
end
