-- Sluice: regions' pools of global counters (`scope: global`). The arithmetic of
-- src/store/pool.rs (`Pool::apply`), mirrored line for line; read it there. A pool is one
-- string key: its twenty-three numbers, in the order of FIELDS below, expiring a few region lease
-- periods after the pool ends (its rate and its ask marker still matter then).
--
-- KEYS     one pool per operation (a key may repeat: each operation sees the ones before it)
-- ARGV[1]  the time in microseconds, or 0 for Redis's TIME (tests pin the clock)
-- ARGV[..] thirteen values per operation: its kind (1 take, 2 return, 3 install, 4 withdraw),
--          then take: want, need, instances, demand, lead, period, ask_ttl, window, floor,
--          advance (1: a fixed window's, asking for the next window ahead);
--          return: units, generation, guard;
--          install: units, guard, epoch, asked_at, offset, left, reported, retry_at, failed,
--          interval (ns), from, prev_guard;
--          withdraw: idle (times in µs)
-- Returns  {now, then per operation: units, free, root_now, until, guard, epoch, generation,
--          flags (1 root failed, 2 asking, 4 an ask follows, 8 for the next window), ask units, ask epoch, ask
--          admitted, ask used, ask guard, mark, tokens_end}
-- A token bucket's arithmetic stays below 2^53 (MAX_SPAN, MAX_INTERVAL): exact in doubles.
-- The layout, defined once in Rust (`mod args` in src/store/redis/pool.rs).
local tonumber, format, gmatch, pairs = tonumber, string.format, string.gmatch, pairs
local ceil, floor, max, min = math.ceil, math.floor, math.max, math.min
local PER_OP, PER_ANSWER = 13, 15
-- How long a pool's state outlives the pool (`KEEP` in src/store/pool.rs).
local KEEP = 60000000
-- The longest time ahead a token bucket's pool counts its tokens over (`MAX_SPAN`).
local MAX_SPAN = 2592000000000
local TAKE, RETURN, INSTALL, WITHDRAW = 1, 2, 3, 4

local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function load(key)
  local p = { granted = 0, used = 0, guard = 0, epoch = 0, generation = 0, ends = 0, offset = 0,
    demand = 0, asked_demand = 0, asked_at = 0, asking_until = 0, reported = 0, failed = 0,
    last_take = 0, interval = 0, full_at = 0, last_grant = 0, n_granted = 0, n_guard = 0,
    n_epoch = 0, n_offset = 0, n_from = 0, n_until = 0 }
  local raw = redis.call('GET', key)
  if raw then
    local v, i = {}, 1
    for n in gmatch(raw, '%-?%d+') do v[i] = tonumber(n); i = i + 1 end
    if i == 24 then
      p.granted, p.used, p.guard, p.epoch, p.generation, p.ends, p.offset = v[1], v[2], v[3],
        v[4], v[5], v[6], v[7]
      p.demand, p.asked_demand, p.asked_at, p.asking_until, p.reported, p.failed, p.last_take =
        v[8], v[9], v[10], v[11], v[12], v[13], v[14]
      p.interval, p.full_at, p.last_grant = v[15], v[16], v[17]
      p.n_granted, p.n_guard, p.n_epoch, p.n_offset, p.n_from, p.n_until = v[18], v[19], v[20],
        v[21], v[22], v[23]
    end
  end
  if max(p.ends, p.asking_until, p.asked_at, p.n_until) + KEEP <= now then
    -- Past what its state is good for (Redis's expiry runs on its own clock): forgotten.
    for field in pairs(p) do p[field] = 0 end
  end
  return p
end

local function alive(p, t)
  if t >= p.full_at or p.interval == 0 then return 0 end
  return floor(min(p.full_at - t, MAX_SPAN) * 1000 / p.interval)
end

local function free(p)
  if now >= p.ends then return 0 end
  if p.interval > 0 then return min(p.granted - p.used, alive(p, now)) end
  return p.granted - p.used
end

local function evaporate(p)
  if p.interval == 0 or p.generation == 0 then return end
  local f, a = p.granted - p.used, alive(p, now)
  if f > a then
    p.used = p.used + (f - a)
    p.reported = min(p.reported + (f - a), p.used)
  end
end

local function span(p, tokens)
  return ceil(tokens * p.interval / 1000)
end

local function front(p)
  return p.full_at - min(span(p, p.granted - p.used), p.full_at)
end

local function take(p, want, need, instances, demand, lead, period, ask_ttl, window, least,
                    advance, answer)
  local f = free(p)
  local units = 0
  if need > 0 and need <= f then
    local share = floor(f / (2 * max(instances, 1)))
    units = min(max(min(want, share), need), f)
  end
  p.used = p.used + units
  if need > 0 then
    if units > 0 then p.demand = p.demand + units else p.demand = p.demand + max(need, demand) end
    p.last_take = now
  end
  answer.units = units
  if need == 0 or now < p.asking_until then return end
  local rate = 0
  if p.asked_at > 0 and now > p.asked_at then
    rate = (p.demand - p.asked_demand) / max(now - p.asked_at, floor(period / 4), 1)
  end
  local low_water = ceil(rate * lead)
  local left = f - units
  local window_end = p.guard + window - p.offset
  local within_lead = now + lead >= p.ends
  local ending = within_lead and (p.interval > 0 or p.ends < window_end)
  local ahead = advance == 1 and within_lead and p.interval == 0 and p.generation ~= 0
    and p.ends >= window_end and p.n_granted == 0
  if units > 0 and left >= max(low_water, 1) and not ending and not ahead then return end
  p.asking_until = now + ask_ttl
  p.asked_at = now
  p.asked_demand = p.demand
  answer.ask = { max(ceil(rate * period), need, least), p.epoch, max(p.used - p.reported, 0), p.used,
    p.guard }
  answer.next = ahead
end

local function add_tokens(p, units, guard, offset)
  local o = max(p.offset, offset)
  p.full_at = p.full_at - min(o - p.offset, p.full_at)
  p.offset = o
  evaporate(p)
  local old = p.granted - p.used
  local new_end = guard - o
  local new_start = max(new_end - span(p, units), 0)
  local full_at, kept = new_end, 0
  if old == 0 or p.full_at >= new_start then
    kept = old
  elseif new_start - p.full_at <= span(p, old) then
    full_at, kept = min(p.full_at + floor(units * p.interval / 1000), new_end), old
  end
  local dropped = old - kept
  p.used = p.used + dropped
  p.reported = min(p.reported + dropped, p.used)
  p.granted = p.granted + units
  p.full_at, p.guard, p.last_grant = full_at, guard, units
  p.generation = max(now, p.generation + 1)
  evaporate(p)
end

local function install_next(p, units, guard, epoch, offset, from, ends, prev_guard, answer)
  if p.generation ~= 0 and p.interval == 0 and prev_guard ~= 0 and p.guard == prev_guard
    and p.epoch == epoch then
    p.ends = max(p.ends, min(max(guard - offset, 0), ends))
  end
  if p.n_granted > 0 and p.n_guard == guard and p.n_epoch == epoch then
    p.n_granted = p.n_granted + units
    p.n_from, p.n_until = max(p.n_from, from), max(p.n_until, ends)
    p.n_offset = max(p.n_offset, offset)
  else
    p.n_granted, p.n_guard, p.n_epoch, p.n_offset, p.n_from, p.n_until = units, guard, epoch,
      offset, from, ends
  end
  answer.units = units
end

local function promote(p)
  if p.n_granted == 0 or now < p.n_from then return end
  p.granted, p.used, p.guard, p.epoch = p.n_granted, 0, p.n_guard, p.n_epoch
  p.generation = max(now, p.generation + 1)
  p.ends, p.offset, p.reported, p.failed = p.n_until, p.n_offset, 0, 0
  p.interval, p.full_at, p.last_grant = 0, 0, 0
  p.n_granted, p.n_guard, p.n_epoch, p.n_offset, p.n_from, p.n_until = 0, 0, 0, 0, 0, 0
end

local function install(p, units, guard, epoch, asked_at, offset, left, reported, retry_at, failed,
                       interval, from, prev_guard, answer)
  p.asking_until = retry_at
  p.failed = failed
  if failed == 1 then return end
  local ends = asked_at + left
  if units > 0 and from > now and interval == 0 and ends > from then
    install_next(p, units, guard, epoch, offset, from, ends, prev_guard, answer)
    return
  end
  local same = p.generation ~= 0 and p.epoch == epoch and p.interval == interval
    and (interval > 0 or p.guard == guard)
  if same then p.reported = min(max(p.reported, reported), p.used) end
  if units == 0 then return end
  if ends <= now then
    answer.ask = { units, epoch, 0, 0, guard }
    return
  end
  if same and interval > 0 then
    add_tokens(p, units, guard, offset)
    p.ends = max(p.ends, ends)
  elseif same then
    p.granted = p.granted + units
    p.ends = max(p.ends, ends)
    p.offset = max(p.offset, offset)
  else
    p.generation = max(now, p.generation + 1)
    p.granted, p.used, p.guard, p.epoch, p.ends, p.offset = units, 0, guard, epoch, ends, offset
    p.reported, p.failed, p.asking_until = 0, 0, 0
    p.interval, p.full_at, p.last_grant = interval, max(guard - offset, 0), units
    evaporate(p)
  end
  answer.units = units
end

local function withdraw(p, idle, answer)
  local f = p.granted - p.used
  local quiet = now >= p.ends or now - p.last_take >= idle
  local unreported = max(p.used - p.reported, 0)
  if p.generation == 0 or (f == 0 and unreported == 0) or not quiet then return end
  local units = f
  if p.interval > 0 then units = min(f, p.last_grant) end
  p.used = p.granted
  p.reported = p.used
  p.last_grant = 0
  answer.units = units
  answer.ask = { units, p.epoch, unreported, p.used, p.guard }
end

local out = { now }
for k = 1, #KEYS do
  local a = 1 + (k - 1) * PER_OP
  local function arg(i) return tonumber(ARGV[a + i]) end
  local kind = arg(1)
  local p = load(KEYS[k])
  evaporate(p)
  promote(p)
  local answer = { units = 0 }
  if kind == TAKE then
    take(p, arg(2), arg(3), arg(4), arg(5), arg(6), arg(7), arg(8), arg(9), arg(10), arg(11),
      answer)
  elseif kind == RETURN then
    local units, generation, guard = arg(2), arg(3), arg(4)
    local current = guard == p.guard
    if p.interval > 0 then current = guard == p.used end
    if generation == p.generation and current and p.generation ~= 0 then
      local back = min(units, p.used)
      p.used = p.used - back
      p.reported = min(p.reported, p.used)
      answer.units = back
    end
  elseif kind == INSTALL then
    install(p, arg(2), arg(3), arg(4), arg(5), arg(6), arg(7), arg(8), arg(9), arg(10), arg(11),
      arg(12), arg(13), answer)
  elseif kind == WITHDRAW then
    withdraw(p, arg(2), answer)
  end
  local keep = max(p.ends, p.asking_until, p.asked_at, p.n_until) + KEEP - now
  if keep <= 0 then
    redis.call('DEL', KEYS[k])
  else
    redis.call('SET', KEYS[k], format(
      '%d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d',
      p.granted, p.used, p.guard, p.epoch, p.generation, p.ends, p.offset, p.demand,
      p.asked_demand, p.asked_at, p.asking_until, p.reported, p.failed, p.last_take, p.interval,
      p.full_at, p.last_grant, p.n_granted, p.n_guard, p.n_epoch, p.n_offset, p.n_from,
      p.n_until), 'PX', max(ceil(keep / 1000), 1))
  end
  local root_now = now
  if p.generation ~= 0 then root_now = now + p.offset end
  local flags = 0
  if p.failed == 1 then flags = flags + 1 end
  if now < p.asking_until then flags = flags + 2 end
  local ask = answer.ask or { 0, 0, 0, 0, 0 }
  if answer.ask then flags = flags + 4 end
  if answer.next then flags = flags + 8 end
  local o = #out
  out[o + 1], out[o + 2], out[o + 3], out[o + 4] = answer.units, free(p), root_now, p.ends
  out[o + 5], out[o + 6], out[o + 7], out[o + 8] = p.guard, p.epoch, p.generation, flags
  out[o + 9], out[o + 10], out[o + 11], out[o + 12], out[o + 13] = ask[1], ask[2], ask[3], ask[4],
    ask[5]
  local tokens_end = 0
  if p.interval > 0 and p.generation ~= 0 then tokens_end = front(p) end
  out[o + 14], out[o + 15] = p.used, tokens_end
end
return out
