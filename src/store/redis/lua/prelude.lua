-- Standard functions as locals: a global is a table lookup on every use.
local tonumber, format, match = tonumber, string.format, string.match
local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
local KEYS, ARGV = KEYS, ARGV
local next, pairs = next, pairs
-- Integers a double holds exactly. Stored counts and answers are clamped into them so that
-- `%d` and Redis's integer replies never see a value they cannot represent (Sluice clamps
-- hits before they get here; this keeps a hand-written or corrupted key harmless too).
local MAX_SAFE = 9007199254740992
local function safe(n)
  if n ~= n then return 0 end -- NaN
  return min(max(n, -MAX_SAFE), MAX_SAFE)
end
-- Counts past MAX_SAFE stay exact, as in the memory store (a usage budget's overdraft can pass
-- any double's integers): such a count is a pair {hi, lo} worth hi * 1e9 + lo, and it
-- saturates at 2^64 - 1. Limits are below MAX_SAFE, so a decision on a count that large is
-- taken on its double (above every limit whatever its rounding); only the sum that is stored
-- needs the exact parts.
local sub = string.sub
local WIDE, MAX_HI, MAX_LO = 1e9, 18446744073, 709551615
local function count_value(c)
  if type(c) == 'table' then return c[1] * WIDE + c[2] end
  return c
end

-- c + n exactly (n an integer below MAX_SAFE in size), never below 0, saturating.
local function count_add(c, n)
  local hi, lo
  if type(c) == 'table' then
    hi, lo = c[1], c[2]
  else
    local s = c + n
    if s < MAX_SAFE then return max(s, 0) end
    hi = floor(c / WIDE)
    lo = c - hi * WIDE
  end
  local n_hi = floor(n / WIDE)
  hi, lo = hi + n_hi, lo + (n - n_hi * WIDE)
  local carry = floor(lo / WIDE)
  hi, lo = hi + carry, lo - carry * WIDE
  if hi < 0 then return 0 end
  if hi > MAX_HI or (hi == MAX_HI and lo > MAX_LO) then return { MAX_HI, MAX_LO } end
  local v = hi * WIDE + lo
  if v < MAX_SAFE then return v end
  return { hi, lo }
end

-- A stored count's digits (at most 20 are stored; more saturate).
local function count_parse(s)
  if #s <= 15 then return tonumber(s) end
  return count_add({ tonumber(sub(s, 1, -10)), tonumber(sub(s, -9)) }, 0)
end

-- A count as two integers a reply can carry: c = hi * 1e9 + lo.
local function count_parts(c)
  if type(c) == 'table' then return c[1], c[2] end
  local hi = floor(c / WIDE)
  return hi, c - hi * WIDE
end

local function count_format(c)
  if type(c) == 'table' then return format('%d%09d', c[1], c[2]) end
  return format('%d', c)
end
