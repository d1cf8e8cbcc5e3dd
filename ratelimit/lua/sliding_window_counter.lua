-- Sliding-window counter: two fixed-window counts, the previous one weighted by the
-- share of it that still overlaps the sliding window. O(1) memory, approximate.
-- key: a hash, w = current window number, c = its count, p = the previous window's
-- count (one key rather than two, so Redis Cluster never sees a cross-slot script).
-- key, now, window, limit and cost come from prelude.lua.

local stored = redis.call('HMGET', key, 'w', 'c', 'p')
local w = tonumber(stored[1])
local c = tonumber(stored[2]) or 0
local p = tonumber(stored[3]) or 0

-- The counts as seen at time t (t >= now) if nothing more is admitted, and the
-- weighted estimate of what the sliding window ending at t holds.
local function counts_at(t)
  local number = math.floor(t / window)
  if w == nil then return number, 0, 0 end
  if number == w then return number, c, p end
  if number == w + 1 then return number, 0, c end
  return number, 0, 0
end
local function estimate_at(t)
  local number, cur, prev = counts_at(t)
  local elapsed = t - number * window
  return prev * ((window - elapsed) / window) + cur
end
-- When the counts drain to zero if nothing more is admitted.
local function reset_at(t, cur, prev)
  local number = math.floor(t / window)
  if cur > 0 then return (number + 2) * window - t end
  if prev > 0 then return (number + 1) * window - t end
  return 0
end

local number, cur, prev = counts_at(now)
local estimate = estimate_at(now)

if estimate + cost > limit then
  -- Earliest whole ms at which the same request would fit: start from the closed
  -- form, then step to the exact edge with the same arithmetic as the check, so
  -- float rounding can never make the answer early.
  local elapsed = now - number * window
  local retry
  if cur + cost <= limit then
    -- fits later in this window, once less of the previous window overlaps
    retry = math.ceil(window - elapsed - (limit - cost - cur) * window / prev)
  else
    -- fits in the next window, once less of this one overlaps
    retry = math.ceil(2 * window - elapsed - (limit - cost) * window / cur)
  end
  if retry < 1 then retry = 1 end
  while estimate_at(now + retry) + cost > limit do retry = retry + 1 end
  while retry > 1 and estimate_at(now + retry - 1) + cost <= limit do retry = retry - 1 end
  local remaining = math.floor(limit - estimate)
  if remaining < 0 then remaining = 0 end
  return {0, remaining, retry, reset_at(now, cur, prev), now}
end

cur = cur + cost
local reset = reset_at(now, cur, prev)
redis.call('HSET', key, 'w', number, 'c', cur, 'p', prev)
redis.call('PEXPIRE', key, reset + ttl_slack)
return {1, math.floor(limit - estimate - cost), 0, reset, now}
