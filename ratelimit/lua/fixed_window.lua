-- Fixed window: one counter per identity for the current aligned window
-- [k * window, (k + 1) * window). Counts admitted cost only.
-- key: a hash, w = window number, n = cost admitted in it.
-- key, now, window, limit and cost come from prelude.lua.

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
redis.call('PEXPIRE', key, reset + ttl_slack)
return {1, limit - used - cost, 0, reset, now}
