-- Fixed window: one counter per identity for the current aligned window
-- [k * window, (k + 1) * window). Counts admitted cost only.
--
-- KEYS[1]  the identity's hash: w = window number, n = cost admitted in it
-- ARGV[1]  now in ms, or "" to read the server's clock (TIME)
-- ARGV[2]  window in ms
-- ARGV[3]  limit (units of cost per window)
-- ARGV[4]  cost of this request
-- returns  {allowed (1/0), remaining, retry_after_ms, reset_after_ms, now_ms}

local key = KEYS[1]
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local number = math.floor(now / window)
local reset = (number + 1) * window - now
local stored = redis.call('HMGET', key, 'w', 'n')
local used = 0
if tonumber(stored[1]) == number then
  used = tonumber(stored[2])
end

if used + cost > limit then
  -- The next window starts empty, and cost <= limit, so it fits then.
  local remaining = limit - used
  if remaining < 0 then remaining = 0 end
  return {0, remaining, reset, reset, now}
end

redis.call('HSET', key, 'w', number, 'n', used + cost)
redis.call('PEXPIRE', key, reset)
return {1, limit - used - cost, 0, reset, now}
