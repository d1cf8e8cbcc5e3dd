-- Shared by every limiter script. ratelimit/scripts.py writes the limiter's options
-- in front of it as constants, since they never change once a limiter is built:
--   window     the window in ms
--   limit      units of cost per window
--   ttl_slack  extra ms added to every TTL (0 normally; replays in virtual time need more)
--   ttl        the TTL, slack included, that covers what a check writes at `now` (the
--              longest its state can matter), as text: Redis formats a number
--              argument with %.17g, which costs as much as a command
--   L1, R      the radixes of the one-integer reply below
--   skew       how far ahead of Redis's clock a stored time is trusted, in ms (-1: any).
--              A host whose clock runs far ahead leaves times that every later check
--              would wait for. A script that finds a stored time more than `skew` ahead
--              of its own `now` reads Redis's clock (TIME, on that path only) and brings
--              every stored time beyond Redis's clock + skew back to that bound, as if
--              the host that wrote it had been that far ahead and no further. A host
--              that is behind changes nothing: the stored times are within the bound.
--   judge      1: the bound is Redis's clock + skew; 0: the check's own time + skew (a
--              limiter on an injected clock, whose times are not Redis's)
--   dry        0: a check; 1: a peek, which decides exactly as the check would at the
--              same time and cost but writes nothing (no write, no TTL change). Its
--              script is the same text with dry = 1, declared read-only to Redis
--              (`#!lua flags=no-writes`), so Redis itself refuses any write it tried.
--              Where a check reads with a write (SET NX GET), a peek reads (GET), and
--              where a check would rewrite state before deciding (times beyond the
--              clock bound), a peek decides on the rewritten values held in Lua.
-- and whatever the algorithm's own file names. A check sends:
--   KEYS[1]  the identity's key
--   ARGV[1]  now in ms, or "" to read the server's clock (TIME)
--   ARGV[2]  cost of this request (1 to limit: the client checks)
--   ARGV[3]  the state a key that holds nothing takes when this request is admitted,
--            as text the client worked out from ARGV[1] and ARGV[2] ("" with ARGV[1]
--            "", and for the sorted-set log, which keeps members instead)
--
-- A script decides inside the `repeat` this file opens: it sets the five results
-- below and `break`s (or reaches its end), and epilogue.lua closes the loop and
-- answers. (No `reply` function: a Lua closure is built anew at every call, and that
-- cost a tenth of a simple check's server time.)
--   ok (1/0), left (remaining), retry_ms (retry_after_ms), reset_ms (reset_after_ms),
--   decided_at (decided_at_ms)
-- `+ 0` rather than tonumber(): the same conversion without a function call.

local key = KEYS[1]
local cost = ARGV[2] + 0
local now = ARGV[1]
local sent = now ~= ''
if sent then
  now = now + 0
else
  local t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end

local ok, left, retry_ms, reset_ms, decided_at
repeat
