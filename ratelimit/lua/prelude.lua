-- Shared by every limiter script: read the common arguments and the time, and
-- answer. (ratelimit/scripts.py puts this in front of each script before loading it.)
--
-- KEYS[1]  the identity's key
-- ARGV[1]  now in ms, or "" to read the server's clock (TIME)
-- ARGV[2]  window in ms
-- ARGV[3]  limit (units of cost per window)
-- ARGV[4]  cost of this request
-- ARGV[5]  extra ms added to every TTL (0 normally; replays in virtual time need more)
-- ARGV[6]  the TTL, slack included, that covers what a check writes at `now` (the
--          longest its state can matter): passed to Redis as the text it came as,
--          since Redis formats a Lua number with %.17g, which costs as much as a command
--
-- A script ends with reply(allowed (1/0), remaining, retry_after_ms, reset_after_ms,
-- decided_at_ms). Turning a Lua table into a Redis reply costs about as much server
-- time as a whole Redis command, so when the decision was made at the `now` the
-- client sent, the five numbers travel as one integer that the client takes apart
-- (ratelimit/_core.py, `_decision`), with L1 = remaining_base (limit + 1, unless the
-- script allows more) and R = 2 * window + 1:
--   admitted:  reset * L1 + remaining                         (>= 0; retry is 0)
--   rejected:  -1 - ((reset * R + retry) * L1 + remaining)    (< 0; 1 <= retry < R)
-- Anything else (a later decision time, Redis's own clock, numbers too large to be
-- exact in a double) is sent as the table {allowed, remaining, retry, reset, at}.
-- `+ 0` rather than tonumber(): the same conversion without a function call.

local key = KEYS[1]
local window = ARGV[2] + 0
local limit = ARGV[3] + 0
local cost = ARGV[4] + 0
local ttl_slack = ARGV[5] + 0
local ttl = ARGV[6]
local now = ARGV[1]
local sent = now ~= ''
if sent then
  now = now + 0
else
  local t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end

local remaining_base = limit + 1 -- more than any `remaining` (gcra.lua raises it)
local function reply(allowed, remaining, retry, reset, at)
  if sent and at == now then
    local code
    if allowed == 1 then
      code = reset * remaining_base + remaining
    elseif retry < 2 * window + 1 then
      code = -1 - ((reset * (2 * window + 1) + retry) * remaining_base + remaining)
    end
    -- Every step is exact while the result is (all terms are non-negative integers).
    if code and code < 9007199254740992 and code > -9007199254740992 then return code end
  end
  return {allowed, remaining, retry, reset, at}
end
