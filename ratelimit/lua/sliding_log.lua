-- Sliding-window log: the exact limiter.
--
-- One sorted set per identity; each admitted unit of cost is one member whose score
-- is the request time in ms. Redis runs the whole script without interleaving other
-- clients, so trim, count and add are one indivisible step.
-- key, now, window, limit, cost and ttl come from prelude.lua.

-- The log's time never runs backwards. A request can reach Redis after one stamped
-- later (it waited in a client queue, or its host's clock is behind), and by then
-- that later request may have trimmed entries this one would still have counted.
-- So the request is decided and recorded at `at`, the later of its own time and the
-- newest entry: every admission then sees every entry that shares a window with it,
-- and no rolling window of recorded times ever holds more than the limit.
local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]
newest = newest and newest + 0 or now
if skew >= 0 and newest > now + skew then
  local bound = now + skew
  if sent and judge == 1 then
    local t = redis.call('TIME')
    bound = t[1] * 1000 + math.floor(t[2] / 1000) + skew
  end
  if newest > bound then
    -- Entries beyond the bound move back to it (ZADD XX: scores only, in batches). A
    -- peek moves none: below, a score read beyond `newest` counts as `newest`.
    if dry == 0 then
      local ahead = redis.call('ZRANGEBYSCORE', key, '(' .. bound, '+inf')
      for i = 1, #ahead, 500 do
        local moved = {}
        for j = i, math.min(i + 499, #ahead) do
          moved[#moved + 1] = bound
          moved[#moved + 1] = ahead[j]
        end
        redis.call('ZADD', key, 'XX', unpack(moved))
      end
      -- The key lives until they leave the window, as if written at the bound.
      redis.call('PEXPIRE', key, math.max(now, bound) + window - now + ttl_slack)
    end
    newest = bound
  end
end
local at = now
if newest > at then at = newest end
-- An entry stamped at s is in the window while s > at - window.
local edge = at - window
local count = redis.call('ZCOUNT', key, '(' .. edge, '+inf')

if count + cost > limit then
  -- Rejected: nothing is written, not even a trim (a trim to a time later than the
  -- newest entry would undercount a request that arrives late). The request fits
  -- once the (count + cost - limit) oldest entries in the window have left it;
  -- waits are measured from the request's own time, so they are never early for it.
  local blocking = redis.call('ZRANGEBYSCORE', key, '(' .. edge, '+inf', 'WITHSCORES',
    'LIMIT', count + cost - limit - 1, 1)
  local remaining = limit - count
  if remaining < 0 then remaining = 0 end
  -- (A moved entry's score is `newest`; only a peek, which moved none, reads more.)
  blocking = blocking[2] + 0
  if blocking > newest then blocking = newest end
  ok, left, retry_ms, reset_ms, decided_at = 0, remaining, blocking + window - now, newest + window - now, at
  break
end

if dry == 1 then
  -- A peek: the admission the check would make, without the trim or the entries.
  ok, left, retry_ms, reset_ms, decided_at = 1, limit - count - cost, 0, at + window - now, at
  break
end

-- Every entry is at or before `at`, so after this trim the set is exactly the window.
redis.call('ZREMRANGEBYSCORE', key, '-inf', edge)

-- Members only have to be unique inside this one key, and nothing else runs while the
-- script does, so the script picks them: a free slot below 2^23, probing upwards from
-- a hash of the time and the set's size, written as 3 raw bytes (big-endian). No two
-- hosts can ever collide, and with at most 10^6 members in 2^23 slots a probe rarely
-- needs a second try. (Every product stays below 2^53, exact in a double.)
-- Why 3 bytes: in a small set (listpack) they take 5 bytes like a 24-bit integer,
-- and once the set is a skiplist every member is its own string allocation, where
-- 3 bytes fit jemalloc's 8-byte class; the 7 decimal digits of the same slot need
-- the 16-byte class (and the classic "<ms>:<counter>" strings 32).
local SLOTS = 8388608 -- 2^23
local function member(s)
  return string.char(math.floor(s / 65536), math.floor(s / 256) % 256, s % 256)
end
local slot = ((now % SLOTS) * 40503 + count * 9973) % SLOTS
for _ = 1, cost do
  while redis.call('ZADD', key, 'NX', at, member(slot)) == 0 do
    slot = (slot + 1) % SLOTS
  end
  slot = (slot + 1) % SLOTS
end

-- The key lives until its newest entry, stamped `at`, leaves the window.
local reset = at + window - now
redis.call('PEXPIRE', key, at == now and ttl or reset + ttl_slack)
ok, left, retry_ms, reset_ms, decided_at = 1, limit - count - cost, 0, reset, at
