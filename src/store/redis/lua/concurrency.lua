-- Concurrency (requests in flight); mirrors src/algorithm/concurrency.rs. State: the count of
-- acquisitions not yet released, refused ones included (their releases come too);
-- every change pushes the key's expiry one safety TTL (`window`) ahead, so lost releases
-- cannot hold capacity forever.
local function concurrency(raw, limit, window, burst, now, hits, guard)
  local count = tonumber(raw) or 0
  local expiry = math.ceil((now + window) / 1000)
  if hits < 0 then
    local after = math.max(count + hits, 0)
    return true, math.max(limit - after, 0), 0, -1, tostring(after), expiry
  end
  if limit > 0 and count + hits <= limit then
    local after = count + hits
    return true, limit - after, 0, -1, tostring(after), expiry
  end
  local retry = -1
  if limit > 0 and hits <= limit then retry = math.min(1000000, window) end
  -- Counted anyway: every acquisition is released later, admitted or not.
  return false, math.max(limit - count, 0), 0, retry, tostring(count + hits), expiry
end
