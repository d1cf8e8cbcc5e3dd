-- Concurrency leases: how many requests of an identity may be in flight at once.
-- key: a sorted set, one member per lease held (its id, ARGV[3], chosen by the client),
-- scored by the time the lease expires in ms, on the limiter's clock (Redis's TIME by
-- default: every host then agrees on when a lease has expired). `window` is a lease's
-- lifetime, `limit` how many may be held at once. ARGV[2] (`cost`, prelude.lua) says
-- what to do with the lease ARGV[3]:
--   1  acquire: drop the expired leases, then add this one if fewer than `limit` remain
--   2  renew: move its expiry to now + window, if it is still held
--   0  release: remove it (a lease that expired or was never held: ok = 0); the client
--      sends it with now = 0, since it needs no time (no TIME under Redis's clock)
-- An acquire whose lease id is already held renews it: an acquire sent again after a
-- dropped connection (ratelimit.plan) holds one lease, not two.
-- Results: ok, left (leases still free), retry_ms (rejected acquire: until the earliest
-- lease expires, the latest a slot frees if nobody releases), reset_ms (until every
-- lease held has expired), decided_at.

local lease = ARGV[3]
if cost == 0 then
  ok, left, retry_ms, reset_ms, decided_at = redis.call('ZREM', key, lease), 0, 0, 0, now
  break
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local expiry = now + window
local held = redis.call('ZCARD', key)
if redis.call('ZSCORE', key, lease) then
  redis.call('ZADD', key, expiry, lease)
  redis.call('PEXPIRE', key, ttl)
  left = limit - held
  if left < 0 then left = 0 end
  ok, retry_ms, reset_ms, decided_at = 1, 0, window, now
  break
end
if cost == 2 or held >= limit then
  local retry, reset = 0, 0
  if held > 0 then
    -- Every lease left expires after now: the first frees a slot, the last all of them.
    retry = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2] - now
    reset = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2] - now
  end
  left = limit - held
  if left < 0 then left = 0 end
  ok, retry_ms, reset_ms, decided_at = 0, retry, reset, now
  break
end
redis.call('ZADD', key, expiry, lease)
redis.call('PEXPIRE', key, ttl)
ok, left, retry_ms, reset_ms, decided_at = 1, limit - held - 1, 0, window, now
