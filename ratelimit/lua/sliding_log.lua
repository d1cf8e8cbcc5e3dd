-- Sliding-window log: the exact limiter.
--
-- One sorted set per identity; each admitted unit of cost is one member whose score
-- is the request time in ms. Redis runs the whole script without interleaving other
-- clients, so trim, count and add are one indivisible step.
--
-- KEYS[1]  the identity's sorted set
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

-- An entry stamped at s is in the window while s > now - window.
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
local count = redis.call('ZCARD', key)

if count + cost > limit then
  -- Rejected: nothing is written. The request fits once the (count + cost - limit)
  -- oldest entries have left the window.
  local blocking = redis.call('ZRANGE', key, count + cost - limit - 1, count + cost - limit - 1, 'WITHSCORES')
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local remaining = limit - count
  if remaining < 0 then remaining = 0 end
  return {0, remaining, tonumber(blocking[2]) + window - now, tonumber(newest[2]) + window - now, now}
end

-- Members only have to be unique inside this one key, and nothing else runs while the
-- script does, so the script picks them: the first free small integer from a slot
-- derived from the time. Small integers are stored as integers in a listpack, far
-- more compact than "<ms>:<counter>" strings, and no two hosts can ever collide.
local SLOTS = 8388608 -- 2^23: fits listpack's 24-bit integer encoding
local slot = (now * 16) % SLOTS
for _ = 1, cost do
  while redis.call('ZADD', key, 'NX', now, slot) == 0 do
    slot = (slot + 1) % SLOTS
  end
  slot = (slot + 1) % SLOTS
end

-- An entry stamped in the future (a replica whose clock runs ahead) must outlive the
-- TTL too, so the key lives until its newest entry leaves the window.
local newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
local reset = newest + window - now
redis.call('PEXPIRE', key, reset)
return {1, limit - count - cost, 0, reset, now}
