-- Token bucket as GCRA (generic cell rate algorithm): one stored number per identity,
-- the theoretical arrival time (TAT) at which the bucket would be full again.
--
-- KEYS[1]  the identity's string: TAT in ms (a float, stored exactly)
-- ARGV[1]  now in ms, or "" to read the server's clock (TIME)
-- ARGV[2]  window in ms
-- ARGV[3]  limit (sustained units of cost per window)
-- ARGV[4]  cost of this request
-- ARGV[5]  burst (units of cost that may arrive at once)
-- returns  {allowed (1/0), remaining, retry_after_ms, reset_after_ms, now_ms}

local key = KEYS[1]
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local burst = tonumber(ARGV[5])
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local interval = window / limit -- ms between two units at the sustained rate
local tolerance = interval * burst
local tat = tonumber(redis.call('GET', key)) or now
if tat < now then tat = now end
local new_tat = tat + interval * cost
local allow_at = new_tat - tolerance

if allow_at > now then
  local remaining = math.floor((now - (tat - tolerance)) / interval)
  if remaining < 0 then remaining = 0 end
  return {0, remaining, math.ceil(allow_at - now), math.ceil(tat - now), now}
end

local reset = math.ceil(new_tat - now)
-- %.17g round-trips a double exactly, so no precision is lost between checks.
redis.call('SET', key, string.format('%.17g', new_tat), 'PX', reset)
return {1, math.floor((now - allow_at) / interval), 0, reset, now}
