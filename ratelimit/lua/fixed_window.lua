-- Fixed window: one counter per identity for the current aligned window
-- [k * window, (k + 1) * window). Counts admitted cost only.
-- key: a string holding one integer, (window number mod P) * M + cost admitted in it.
-- P window numbers span two years (windows P/2 or more apart would be confused) and
-- M = floor(2^53 / P) keeps the integer exact in a Lua double; both depend on the
-- window alone, so a limiter with another limit reads the same count. Adding a cost
-- (<= limit) to a count (<= the limit it was admitted under) never carries into the
-- window digits: validation.fixed_window_range refuses limits above M / 2 for the
-- window. M and P are constants.
-- A request that opens its window is one SET (NX, GET, with its TTL) of ARGV[3], the
-- value the client worked out; a later one in the same window adds its cost with
-- INCRBY (the key keeps the TTL it got when its window opened, which covers that
-- window); a rejected one writes nothing.
-- key, now, window, limit, cost and ttl come from prelude.lua.

local opening = ARGV[3]
if not sent then opening = math.floor(now / window) % P * M + cost end
local stored
if dry == 0 then
  stored = redis.pcall('SET', key, opening, 'NX', 'GET', 'PX', ttl)
else
  stored = redis.pcall('GET', key) -- a peek reads without opening anything
end
if type(stored) == 'table' then
  -- Only a key of another type is replaced (an earlier version kept a hash here):
  -- this identity's count starts again. Any other error goes back as it is.
  if not string.find(tostring(stored.err), 'WRONGTYPE', 1, true) then return stored end
  if dry == 0 then
    redis.call('DEL', key)
    redis.call('SET', key, opening, 'PX', ttl)
  end
  stored = false
end
if not stored then
  -- A new key: this request opens its window, which ends in window - now % window
  -- ms (Lua's % rounds down, like math.floor).
  ok, left, retry_ms, reset_ms, decided_at = 1, limit - cost, 0, window - now % window, now
  break
end

local number = math.floor(now / window)
stored = stored + 0
local stored_number = math.floor(stored / M)
-- How many windows the stored count is behind this request's window.
local behind = (number % P - stored_number) % P
if behind ~= 0 and behind < P / 2 then
  -- A count from an earlier window: this request opens its own.
  if dry == 0 then redis.call('SET', key, opening, 'PX', ttl) end
  ok, left, retry_ms, reset_ms, decided_at = 1, limit - cost, 0, (number + 1) * window - now, now
  break
end

-- The stored window never moves backwards: a request stamped before it (its host's
-- clock is behind the one that opened the window) counts in the stored window.
if behind ~= 0 then
  number = number + P - behind
  if skew >= 0 and number * window > now + skew then
    -- A window opened by a host far ahead: its count moves to the window that holds
    -- the bound up to which times are trusted (prelude.lua, `skew`), if that is earlier.
    local bound = now + skew
    if sent and judge == 1 then
      local t = redis.call('TIME')
      bound = t[1] * 1000 + math.floor(t[2] / 1000) + skew
    end
    local trusted = math.floor(bound / window)
    if trusted < number then
      number = math.max(trusted, math.floor(now / window))
      stored = number % P * M + stored - stored_number * M
      stored_number = number % P
      if dry == 0 then
        redis.call('SET', key, stored, 'PX', (number + 1) * window - now + ttl_slack)
      end
    end
  end
end
local used = stored - stored_number * M + cost -- including this request's cost
local reset = (number + 1) * window - now
if used > limit then
  -- The next window starts empty, and cost <= limit, so it fits then. (The count can
  -- exceed the limit: a lower limit read a count admitted under a higher one.)
  local remaining = limit - used + cost
  if remaining < 0 then remaining = 0 end
  ok, left, retry_ms, reset_ms, decided_at = 0, remaining, reset, reset, now
  break
end
if dry == 0 then redis.call('INCRBY', key, ARGV[2]) end
ok, left, retry_ms, reset_ms, decided_at = 1, limit - used, 0, reset, now
