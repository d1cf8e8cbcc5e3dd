-- Sliding-window counter: two fixed-window counts, the previous one weighted by the
-- share of it that still overlaps the sliding window. O(1) memory, approximate.
-- key: a string "<window number>:<its count>:<the previous window's count>", one SET
-- (NX, GET: a key that holds nothing takes ARGV[3], "<this window>:<cost>:0" as the
-- client wrote it) and, unless it opened the key, one more SET (with its TTL) per
-- admitted check; one key, so Redis Cluster never sees a cross-slot script.
-- key, now, window, limit, cost and ttl (two windows, plus slack) come from prelude.lua.

local opening = ARGV[3]
if not sent then opening = math.floor(now / window) .. ':' .. cost .. ':0' end
local w, c, p -- the stored state; w is nil for a new key
local stored
if dry == 0 then
  stored = redis.pcall('SET', key, opening, 'NX', 'GET', 'PX', ttl)
else
  stored = redis.pcall('GET', key) -- a peek reads without opening anything
end
if type(stored) == 'table' then
  -- Only a key of another type is dropped (an earlier version kept a hash here):
  -- this identity's counts start again. Any other error goes back as it is.
  if not string.find(tostring(stored.err), 'WRONGTYPE', 1, true) then return stored end
  if dry == 0 then
    redis.call('DEL', key)
    redis.call('SET', key, opening, 'PX', ttl)
  end
  stored = false
end
if not stored then
  -- A new key, now holding this request (cost <= limit always fits an empty window);
  -- it drains when the window after this one ends.
  ok, left, retry_ms, reset_ms, decided_at = 1, limit - cost, 0, 2 * window - now % window, now
  break
end
local sw, sc, sp = string.match(stored, '^(%-?%d+):(%d+):(%d+)$')
w, c, p = sw + 0, sc + 0, sp + 0

-- The counts as seen at time t (t >= now) if nothing more is admitted.
local function counts_at(t)
  local number = math.floor(t / window)
  if w == nil then return number, 0, 0 end
  if number == w then return number, c, p end
  if number == w + 1 then return number, 0, c end
  return number, 0, 0
end
-- When the counts drain to zero if nothing more is admitted.
local function reset_at(t, cur, prev)
  local number = math.floor(t / window)
  if cur > 0 then return (number + 2) * window - t end
  if prev > 0 then return (number + 1) * window - t end
  return 0
end

local number, cur, prev = counts_at(now)
local elapsed = now - number * window
local estimate = prev * ((window - elapsed) / window) + cur

if estimate + cost > limit then
  -- The weighted estimate of what the sliding window ending at t holds.
  local function estimate_at(t)
    local n, cu, pr = counts_at(t)
    return pr * ((window - (t - n * window)) / window) + cu
  end
  -- Earliest whole ms at which the same request would fit: start from the closed
  -- form, then step to the exact edge with the same arithmetic as the check, so
  -- float rounding can never make the answer early.
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
  ok, left, retry_ms, reset_ms, decided_at = 0, remaining, retry, reset_at(now, cur, prev), now
  break
end

cur = cur + cost
local reset = reset_at(now, cur, prev)
if dry == 1 then
  -- A peek: the admission the check would make, without its SET.
elseif cur == cost and prev == 0 then
  redis.call('SET', key, opening, 'PX', ttl) -- all aged out: as a key that held nothing
else
  redis.call('SET', key, number .. ':' .. cur .. ':' .. prev, 'PX', ttl)
end
ok, left, retry_ms, reset_ms, decided_at = 1, math.floor(limit - estimate - cost), 0, reset, now
