-- Token bucket as GCRA (generic cell rate algorithm): one stored number per identity,
-- the theoretical arrival time (TAT) at which the bucket would be full again.
-- key: a string, the TAT in ms (a float, stored exactly).
-- key, now, window, limit, cost and ttl (the tolerance, plus slack) come from
-- prelude.lua; ARGV[7] is the burst (units of cost that may arrive at once).

local burst = ARGV[7] + 0
-- `remaining` counts units that may still arrive at once: up to the burst.
if burst > limit then remaining_base = burst + 1 end

-- TATs are ~1e12 ms, where a double's last bit is ~0.0002 ms: float rounding must not
-- turn "exactly on time" into "early" (a limit of 3 per 1000 ms admitting only 2 at
-- once), so times within a microsecond of each other count as equal.
local EPSILON = 0.001
local interval = window / limit -- ms between two units at the sustained rate
local tolerance = interval * burst
local tat = tonumber(redis.call('GET', key)) or now
if tat < now then tat = now end
local new_tat = tat + interval * cost
local allow_at = new_tat - tolerance

if allow_at - now > EPSILON then
  local remaining = math.floor((now - (tat - tolerance) + EPSILON) / interval)
  if remaining < 0 then remaining = 0 end
  -- The first whole ms at which allow_at - t <= EPSILON: float noise must not add a ms.
  return reply(0, remaining, math.ceil(allow_at - now - EPSILON), math.ceil(tat - now), now)
end

local reset = math.ceil(new_tat - now)
-- A number argument reaches Redis as %.17g, which round-trips a double exactly. The
-- TAT is at most the tolerance ahead of now, so the key outlives it.
redis.call('SET', key, new_tat, 'PX', ttl)
return reply(1, math.floor((now - allow_at + EPSILON) / interval), 0, reset, now)
