-- Fixed window: one counter per identity for the current aligned window
-- [k * window, (k + 1) * window). Counts admitted cost only.
-- key: a string holding one integer, (window number mod P) * M + cost admitted in it,
-- so that the usual check is INCRBY + PEXPIRE, the work of the plainest Redis counter.
-- M = 2 * limit + 1: adding a cost (<= limit) to a count (<= limit) never carries into
-- the window digits. P = floor(2^53 / M) keeps the integer exact in a Lua double;
-- windows P/2 or more apart would be confused, so policy.py refuses the (extreme)
-- options under which that spans less than a year of time.
-- key, now, window, limit, cost and ttl (one window, plus slack) come from prelude.lua.

local M = 2 * limit + 1
local P = math.floor(9007199254740992 / M)
local number = math.floor(now / window)
local stored = redis.pcall('INCRBY', key, cost)
if type(stored) == 'table' then
  -- Only a key of another type is replaced (an earlier version kept a hash here):
  -- this identity's count starts again. Any other error goes back as it is.
  if not string.find(tostring(stored.err), 'WRONGTYPE', 1, true) then return stored end
  redis.call('DEL', key)
  stored = redis.call('INCRBY', key, cost)
end
local stored_number = math.floor(stored / M)
-- How many windows the stored count is behind this request's window.
local behind = (number % P - stored_number) % P

if stored == cost or (behind ~= 0 and behind < P / 2) then
  -- A new key, or a count from an earlier window: this request opens its window.
  local reset = (number + 1) * window - now
  redis.call('SET', key, number % P * M + cost, 'PX', ttl)
  return reply(1, limit - cost, 0, reset, now)
end

-- The stored window never moves backwards: a request stamped before it (its host's
-- clock is behind the one that opened the window) counts in the stored window.
if behind ~= 0 then number = number + P - behind end
local used = stored - stored_number * M -- including this request's cost
local reset = (number + 1) * window - now
if used > limit then
  -- The next window starts empty, and cost <= limit, so it fits then.
  redis.call('DECRBY', key, cost)
  return reply(0, limit - used + cost, reset, reset, now)
end
-- A late request's window ends more than a window from now: its own TTL, then.
redis.call('PEXPIRE', key, behind == 0 and ttl or reset + ttl_slack)
return reply(1, limit - used, 0, reset, now)
