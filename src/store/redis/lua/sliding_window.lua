-- Sliding window (weighted two-window counter); mirrors src/algorithm/sliding_window.rs,
-- with the floating point operations in the same order, so both give the same answers.
-- Stored as "last previous current": the time of the last charge (an earlier `now` is read
-- as it: a clock that steps back neither adds nor removes capacity) and the counts of its
-- window and the one before; the key expires two windows after the start of `last`'s window.
-- (The first version stored that start instead of `last`; it reads the same way.) Decoded
-- once per call into {last, previous, current}.
local function sliding_window_decode(raw)
  local s, p, c = match(raw, '^(%d+) (%d+) (%d+)$')
  if s then return { safe(tonumber(s)), count_parse(p), count_parse(c) } end
end

local function sliding_window_encode(st)
  return format('%d %s %s', max(safe(st[1]), 0), count_format(st[2]), count_format(st[3]))
end

-- Hits still available with `c` in the current window.
local function sliding_window_remaining(limit, window, elapsed, previous, c)
  local left = limit - (previous * (window - elapsed) / window + c)
  if left <= 0 then return 0 end
  return floor(left)
end

-- Time until nothing is counted any more.
local function sliding_window_reset(window, ws, now, previous, c)
  local until_t = now
  if c > 0 then until_t = ws + 2 * window elseif previous > 0 then until_t = ws + window end
  return max(until_t - now, 0)
end

local function sliding_window(st, limit, window, burst, now, hits, guard, overdraft)
  if st and st[1] > now then now = st[1] end
  local ws = now - (now % window)
  local previous, current = 0, 0
  if st then
    local stored = st[1] - (st[1] % window)
    if stored == ws then
      previous, current = st[2], st[3]
    elseif stored + window == ws then
      previous = st[3]
    end
  end
  local elapsed = now - ws
  local expiry = (ws + 2 * window) / 1000
  -- The counts as doubles for the decision (exact below MAX_SAFE); the stored sums exact.
  local exact_previous, exact_current = previous, current
  previous, current = count_value(previous), count_value(current)
  if hits < 0 then
    local after = exact_current
    if not (guard >= 0 and guard ~= ws) then after = count_add(exact_current, hits) end
    local a = count_value(after)
    return true, sliding_window_remaining(limit, window, elapsed, previous, a),
      sliding_window_reset(window, ws, now, previous, a), -1, { now, exact_previous, after },
      expiry
  end
  local room = hits
  if overdraft and room < 1 then room = 1 end
  if limit > 0 and previous * (window - elapsed) / window + current + room <= limit then
    local after = current + hits
    return true, sliding_window_remaining(limit, window, elapsed, previous, after),
      sliding_window_reset(window, ws, now, previous, after), -1,
      { now, exact_previous, after }, expiry
  end
  -- A usage budget records the refused charge: the overdraft slides out with its windows.
  local recorded, over = nil, nil
  if overdraft then
    local after = exact_current
    if hits > 0 then
      after = count_add(exact_current, hits)
      current = count_value(after)
      recorded = { now, exact_previous, after }
    end
    -- The overdraft: the current count (exact) plus the previous window's whole weighted
    -- hits, less the limit.
    over = count_add(after, floor(previous * (window - elapsed) / window) - limit)
  end
  local retry = -1
  if limit > 0 and hits <= limit then
    local finish = ws + window
    local t = nil
    if previous > 0 and current + room <= limit then
      local within = ceil(finish - (limit - room - current) * window / previous)
      if within < finish then t = within end
    end
    if t == nil then
      if current > 0 then
        t = max(ceil((finish + window) - (limit - room) * window / current), finish)
      else
        t = finish
      end
    end
    retry = max(t - now, 0)
  end
  return false, sliding_window_remaining(limit, window, elapsed, previous, current),
    sliding_window_reset(window, ws, now, previous, current), retry, recorded, expiry, over
end
