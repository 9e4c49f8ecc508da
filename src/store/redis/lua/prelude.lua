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
