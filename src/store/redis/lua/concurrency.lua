-- Concurrency (requests in flight); mirrors src/algorithm/concurrency.rs. Stored as the
-- count of acquisitions not yet released, refused ones included (their releases come too);
-- every change pushes the key's expiry one safety TTL (`window`) ahead, so lost releases
-- cannot hold capacity forever. Decoded once per call into {count}.
local function concurrency_decode(raw)
  local count = tonumber(raw)
  -- A negative or non-finite count is no state a release or acquisition could have left.
  if count and count >= 0 and count < MAX_SAFE then return { floor(count) } end
end

local function concurrency_encode(st)
  return format('%d', max(safe(st[1]), 0))
end

local function concurrency(st, limit, window, burst, now, hits, guard)
  local count = 0
  if st then count = st[1] end
  local expiry = ceil((now + window) / 1000)
  if hits < 0 then
    local after = max(count + hits, 0)
    return true, max(limit - after, 0), 0, -1, { after }, expiry
  end
  if limit > 0 and count + hits <= limit then
    local after = count + hits
    return true, limit - after, 0, -1, { after }, expiry
  end
  local retry = -1
  if limit > 0 and hits <= limit then retry = min(1000000, window) end
  -- Counted anyway: every acquisition is released later, admitted or not.
  return false, max(limit - count, 0), 0, retry, { count + hits }, expiry
end
