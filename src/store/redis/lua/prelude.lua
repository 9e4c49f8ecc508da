-- Standard functions as locals: a global is a table lookup on every use.
local tonumber, format, match = tonumber, string.format, string.match
local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
local KEYS, ARGV = KEYS, ARGV
