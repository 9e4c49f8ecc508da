-- Token bucket as GCRA; mirrors src/algorithm/token_bucket.rs, floating point operations in
-- the same order. Stored as "tat last": the theoretical arrival time in microseconds, written
-- with 17 significant digits so that it reads back as the same double (fractional tokens are
-- kept), and the time of the last charge, to which an earlier `now` is clamped (a clock that
-- steps back neither adds nor removes tokens). A state of the first version, "tat", reads as
-- one without a last charge. Decoded once per call into {tat, last}.
local function token_bucket_decode(raw)
  local t, last = match(raw, '^(%S+) (%d+)$')
  if not t then t, last = raw, '0' end
  t, last = tonumber(t), safe(tonumber(last))
  -- An arrival time no clock reaches (or NaN) is no state a charge could have left.
  if t and t >= 0 and t < MAX_SAFE then return { t, last } end
end

local function token_bucket_encode(st)
  return format('%.17g %d', st[1], st[2])
end

local function token_bucket_remaining(capacity, interval, t, now)
  local left = floor((capacity - (t - now)) / interval)
  if left <= 0 then return 0 end
  return left
end

local function micros(d)
  if d <= 0 then return 0 end
  return ceil(d)
end

local function token_bucket(st, limit, window, burst, now, hits, guard, overdraft)
  local tat = now
  if st then
    now = max(now, st[2])
    tat = st[1]
  end
  tat = max(tat, now)
  if limit == 0 or burst == 0 then
    return hits < 0, 0, 0, -1, nil, 0
  end
  local interval = window / limit
  local capacity = burst * interval
  local t
  if hits < 0 then
    t = max(tat - (-hits) * interval, now)
  else
    t = tat + hits * interval
    local room = hits
    if overdraft and room < 1 then room = 1 end
    if tat + room * interval - capacity > now then
      -- A usage budget records the refused charge: the bucket goes into debt.
      local current, recorded = tat, nil
      if overdraft and hits > 0 then current, recorded = t, { t, now } end
      local retry, over = -1, nil
      if hits <= burst then retry = micros(current + room * interval - capacity - now) end
      -- A budget's debt: the tokens used past the burst.
      if overdraft then over = max(floor((current - now - capacity) / interval), 0) end
      return false, token_bucket_remaining(capacity, interval, current, now), micros(current - now),
        retry, recorded, ceil(current / 1000), over
    end
  end
  return true, token_bucket_remaining(capacity, interval, t, now), micros(t - now), -1,
    { t, now }, ceil(t / 1000)
end
