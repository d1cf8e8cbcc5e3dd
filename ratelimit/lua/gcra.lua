-- Token bucket as GCRA (generic cell rate algorithm): one stored number per identity,
-- the theoretical arrival time (TAT) at which the bucket would be full again.
-- key: a string, the TAT in ms (a float, stored exactly).
-- key, now, window, limit, cost and ttl (the tolerance, plus slack) come from
-- prelude.lua; the constants burst (units of cost that may arrive at once), interval
-- (window / limit: ms between two units at the sustained rate) and tolerance
-- (interval * burst) from ratelimit/scripts.py.
-- A key that holds nothing takes ARGV[3], now + interval * cost as the client worked
-- it out (the same double), in the one SET (NX, GET) that reads the key.

-- TATs are ~1e12 ms, where a double's last bit is ~0.0002 ms: float rounding must not
-- turn "exactly on time" into "early" (a limit of 3 per 1000 ms admitting only 2 at
-- once), so times within a microsecond of each other count as equal.
local EPSILON = 0.001
local opening = ARGV[3]
if not sent then opening = now + interval * cost end
local stored
if dry == 0 then
  stored = redis.call('SET', key, opening, 'NX', 'GET', 'PX', ttl)
else
  stored = redis.call('GET', key) -- a peek reads without opening anything
end
local tat = now
if stored then
  tat = stored + 0
  if tat < now then tat = now end
  if skew >= 0 and tat > now + skew + tolerance then
    -- Written by a host far ahead: no check at the bound up to which times are trusted
    -- (prelude.lua, `skew`) could have left a TAT beyond bound + tolerance.
    local bound = now + skew
    if sent and judge == 1 then
      local t = redis.call('TIME')
      bound = t[1] * 1000 + math.floor(t[2] / 1000) + skew
    end
    if tat > bound + tolerance then
      tat = math.max(bound + tolerance, now)
      if dry == 0 then redis.call('SET', key, tat, 'PX', math.ceil(tat - now) + 1 + ttl_slack) end
    end
  end
end
local new_tat = tat + interval * cost
local allow_at = new_tat - tolerance

if allow_at - now > EPSILON then
  -- (Never for a key that held nothing: cost <= burst.)
  local remaining = math.floor((now - (tat - tolerance) + EPSILON) / interval)
  if remaining < 0 then remaining = 0 end
  -- The first whole ms at which allow_at - t <= EPSILON: float noise must not add a ms.
  ok, left, retry_ms, reset_ms, decided_at = 0, remaining, math.ceil(allow_at - now - EPSILON), math.ceil(tat - now), now
  break
end

if stored and dry == 0 then
  -- A TAT in the past starts from now, as a key that held nothing: ARGV[3] again.
  -- Otherwise a number argument reaches Redis as %.17g, which round-trips a double
  -- exactly. The TAT is at most the tolerance ahead of now, so the key outlives it.
  redis.call('SET', key, tat == now and opening or new_tat, 'PX', ttl)
end
ok, left, retry_ms, reset_ms, decided_at = 1, math.floor((now - allow_at + EPSILON) / interval), 0, math.ceil(new_tat - now), now
