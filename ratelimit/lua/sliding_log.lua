-- Sliding-window log: the exact limiter.
--
-- One sorted set per identity; each admitted unit of cost is one member whose score
-- is the request time in ms. Redis runs the whole script without interleaving other
-- clients, so trim, count and add are one indivisible step.
-- key, now, window, limit and cost come from prelude.lua.

-- An entry stamped at s is in the window while s > now - window.
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
local count = redis.call('ZCARD', key)

if count + cost > limit then
  -- Rejected: nothing is written. The request fits once the (count + cost - limit)
  -- oldest entries have left the window.
  local last_to_leave = count + cost - limit - 1 -- 0-based rank, oldest first
  local blocking = redis.call('ZRANGE', key, last_to_leave, last_to_leave, 'WITHSCORES')
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local remaining = limit - count
  if remaining < 0 then remaining = 0 end
  return {0, remaining, tonumber(blocking[2]) + window - now, tonumber(newest[2]) + window - now, now}
end

-- Members only have to be unique inside this one key, and nothing else runs while the
-- script does, so the script picks them: a free integer below 2^23, probing upwards
-- from a hash of the time and the set's size. No two hosts can ever collide, small
-- integers are stored as integers in a listpack (far more compact than the classic
-- "<ms>:<counter>" strings), and with at most 10^6 members in 2^23 slots a probe
-- rarely needs a second try. (Every product stays below 2^53, exact in a double.)
local SLOTS = 8388608 -- 2^23: fits listpack's 24-bit integer encoding
local slot = ((now % SLOTS) * 40503 + count * 9973) % SLOTS
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
redis.call('PEXPIRE', key, reset + ttl_slack)
return {1, limit - count - cost, 0, reset, now}
