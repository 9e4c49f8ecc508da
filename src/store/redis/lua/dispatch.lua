-- The algorithms above by their code (1 fixed_window, 2 sliding_window, 3 token_bucket,
-- 4 concurrency, 5 a fixed window in the reference's layout: `args` in
-- src/store/redis/mod.rs), and the time of the call: ARGV[1] in microseconds, or 0 for
-- Redis's TIME (tests pin the clock). Shared by the two drivers that follow it, batch.lua
-- and lease.lua (which never leases code 5).
local steps = { fixed_window, sliding_window, token_bucket, concurrency, reference_window }
local decoders = {
  fixed_window_decode, sliding_window_decode, token_bucket_decode, concurrency_decode,
  reference_window_decode,
}
local encoders = {
  fixed_window_encode, sliding_window_encode, token_bucket_encode, concurrency_encode,
  reference_window_encode,
}

local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
