-- Token bucket as GCRA; mirrors src/algorithm/token_bucket.rs, floating point operations in
-- the same order. State: "tat last", the theoretical arrival time in microseconds, written
-- with 17 significant digits so that it reads back as the same double (fractional tokens are
-- kept), and the time of the last charge, to which an earlier `now` is clamped (a clock that
-- steps back neither adds nor removes tokens). A state of the first version, "tat", reads as
-- one without a last charge.
local function token_bucket(raw, limit, window, burst, now, hits, guard)
  local tat = now
  if raw then
    local t, last = string.match(raw, '^(%S+) (%d+)$')
    if t then
      now = math.max(now, tonumber(last))
      tat = tonumber(t)
    else
      tat = tonumber(raw) or now
    end
  end
  tat = math.max(tat, now)
  if limit == 0 or burst == 0 then
    return hits < 0, 0, 0, -1, nil, 0
  end
  local interval = window / limit
  local capacity = burst * interval
  local function micros(d)
    if d <= 0 then return 0 end
    return math.ceil(d)
  end
  local function remaining(t)
    local left = math.floor((capacity - (t - now)) / interval)
    if left <= 0 then return 0 end
    return left
  end
  local function charged(t)
    return true, remaining(t), micros(t - now), -1, string.format('%.17g %d', t, now), math.ceil(t / 1000)
  end
  if hits < 0 then
    return charged(math.max(tat - (-hits) * interval, now))
  end
  local candidate = tat + hits * interval
  if candidate - capacity <= now then
    return charged(candidate)
  end
  local retry = -1
  if hits <= burst then retry = micros(candidate - capacity - now) end
  return false, remaining(tat), micros(tat - now), retry, nil, 0
end
