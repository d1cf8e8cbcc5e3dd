-- Shared by every limiter script: read the common arguments and the time.
-- (ratelimit/scripts.py puts this in front of each script before loading it.)
--
-- KEYS[1]  the identity's key
-- ARGV[1]  now in ms, or "" to read the server's clock (TIME)
-- ARGV[2]  window in ms
-- ARGV[3]  limit (units of cost per window)
-- ARGV[4]  cost of this request
-- ARGV[5]  extra ms added to every TTL (0 normally; replays in virtual time need more)
-- Every script returns {allowed (1/0), remaining, retry_after_ms, reset_after_ms, now_ms}.

local key = KEYS[1]
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local ttl_slack = tonumber(ARGV[5])
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
