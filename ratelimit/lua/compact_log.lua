-- Sliding-window log, compact: the same exact decisions as sliding_log.lua, in about
-- 6 bytes per admitted unit of cost instead of a sorted-set member (~100 bytes once a
-- key holds more than 128).
--
-- The log is the sequence of admission times, one entry per unit of cost, numbered
-- from 0 in the order written; since the log's time never runs backwards (see
-- sliding_log.lua) the sequence is sorted. Entry q is 6 bytes, big-endian, of
-- (time + OFFSET), in chunk floor(q / C). key is a hash:
--   h    a header of three 6-byte numbers: s (entries ever written), b (the first
--        entry that may still be in the window: those before it have left) and o
--        (entry b's time); then the head chunk, floor((s - 1) / C), which takes new
--        entries;
--   t    the tail chunk, floor(b / C), when it is not the head chunk;
--   <k>  every chunk strictly between them, under its number.
-- Most checks read h alone: while entry b is still in the window, nothing has left
-- and the count is s - b. Otherwise b moves past what has left (a binary search
-- over chunks, then within one), and a chunk is deleted once b has passed it: each
-- entry is written once and deleted once.
-- key, now, window, limit, cost and ttl come from prelude.lua. ARGV[3] is a new log's
-- header as the client wrote it for this request (s = cost, b = 0, o = now), so a
-- log's first entry needs no encoding here.

local C = 63 -- entries per chunk: 378 bytes, which fits a 384-byte allocation
local OFFSET = 140737488355328 -- 2^47: times from -2^47 to 2^47 ms fit in 6 bytes
local byte = string.byte

local h = redis.call('HGET', key, 'h')
local s, b, o, newest = 0, 0, 0, now
if h then
  local x1, x2, x3, x4, x5, x6 = byte(h, 1, 6)
  s = ((x1 * 256 + x2) * 256 + x3) * 16777216 + (x4 * 256 + x5) * 256 + x6
  x1, x2, x3, x4, x5, x6 = byte(h, 7, 12)
  b = ((x1 * 256 + x2) * 256 + x3) * 16777216 + (x4 * 256 + x5) * 256 + x6
  x1, x2, x3, x4, x5, x6 = byte(h, 13, 18)
  o = ((x1 * 256 + x2) * 256 + x3) * 16777216 + (x4 * 256 + x5) * 256 + x6 - OFFSET
  x1, x2, x3, x4, x5, x6 = byte(h, -6, -1)
  newest = ((x1 * 256 + x2) * 256 + x3) * 16777216 + (x4 * 256 + x5) * 256 + x6 - OFFSET
end
-- The bound up to which stored times are trusted, when the newest is beyond it (see
-- prelude.lua, `skew`); nil otherwise, as on nearly every check.
local bound
if h and skew >= 0 and newest > now + skew then
  bound = now + skew
  if sent and judge == 1 then
    local t = redis.call('TIME')
    bound = t[1] * 1000 + math.floor(t[2] / 1000) + skew
  end
  if newest <= bound then bound = nil end
end
local at = now
if newest > at then at = newest end
local edge = at - window -- an entry stamped e is in the window while e > edge

-- Reading any entry, past the header: only once entries have left the window, for a
-- rejection of cost > 1, or when the log holds more than the limit (a lower limit
-- now reads a log written under a higher one). Most checks need none of that, and
-- skip building it.
local t, loaded, entry = nil, nil, nil
-- The head and tail chunks' numbers (an empty log's head is chunk 0), worked out only
-- where they are needed: a rejection that reads the header alone needs neither.
local hc, tc
if h and (o <= edge or cost > 1 or s - b > limit or bound) then
  hc, tc = math.floor((s - 1) / C), math.floor(b / C) -- (h: s > 0)
  loaded = {}
  entry = function(q)
    local k = math.floor(q / C)
    local str, i
    if k == hc then
      str, i = h, 19 + (q - k * C) * 6
    else
      if k == tc then
        t = t or redis.call('HGET', key, 't')
        str = t
      else
        str = loaded[k] or redis.call('HGET', key, tostring(k))
        loaded[k] = str
      end
      i = 1 + (q - k * C) * 6
    end
    local x1, x2, x3, x4, x5, x6 = byte(str, i, i + 5)
    return ((x1 * 256 + x2) * 256 + x3) * 16777216 + (x4 * 256 + x5) * 256 + x6 - OFFSET
  end
end

if bound then
  -- Entries beyond the bound (a suffix: the log is sorted) are rewritten to it, chunk
  -- by chunk; the log stays sorted, and the header's o with them if entry b is one.
  local lo, hi = b, s - 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if entry(mid) > bound then hi = mid else lo = mid + 1 end
  end
  local x = bound + OFFSET
  local xhi = math.floor(x / 16777216)
  local xlo = x - xhi * 16777216
  local stamp = string.char(math.floor(xhi / 65536), math.floor(xhi / 256) % 256, xhi % 256,
    math.floor(xlo / 65536), math.floor(xlo / 256) % 256, xlo % 256)
  for k = math.floor(lo / C), hc do
    local first = math.max(lo, k * C) - k * C
    local n = math.min(s - 1, k * C + C - 1) - k * C - first + 1
    if k == hc then
      h = string.sub(h, 1, 18 + first * 6) .. string.rep(stamp, n) .. string.sub(h, 19 + (first + n) * 6)
    elseif k == tc then
      t = t or redis.call('HGET', key, 't')
      t = string.sub(t, 1, first * 6) .. string.rep(stamp, n) .. string.sub(t, 1 + (first + n) * 6)
      if dry == 0 then redis.call('HSET', key, 't', t) end
    else
      local str = loaded[k] or redis.call('HGET', key, tostring(k))
      loaded[k] = string.sub(str, 1, first * 6) .. string.rep(stamp, n) .. string.sub(str, 1 + (first + n) * 6)
      if dry == 0 then redis.call('HSET', key, tostring(k), loaded[k]) end
    end
  end
  if lo == b then
    o = bound
    h = string.sub(h, 1, 12) .. stamp .. string.sub(h, 19)
  end
  newest = bound
  at = now
  if newest > at then at = newest end
  edge = at - window
  -- A peek keeps the rewritten chunks in h, t and loaded only, which `entry` reads.
  if dry == 0 then
    redis.call('HSET', key, 'h', h)
    -- The key lives until the moved entries leave the window, as if written at the bound.
    redis.call('PEXPIRE', key, at + window - now + ttl_slack)
  end
end

local moved = false -- whether b moved past entries that have left
if s > b and o <= edge then
  -- Entries have left since the last admission: move b past them.
  if newest <= edge then
    b = s -- all of them
  else
    -- The first chunk whose last entry is still in (the head chunk's is: newest).
    local lo, hi = tc, hc
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if entry(mid * C + C - 1) <= edge then lo = mid + 1 else hi = mid end
    end
    -- Then the first entry in that chunk that is still in.
    local first, last = math.max(b, lo * C), math.min(s, lo * C + C) - 1
    while first < last do
      local mid = math.floor((first + last) / 2)
      if entry(mid) <= edge then first = mid + 1 else last = mid end
    end
    b = first
    o = entry(b)
  end
  moved = true
end
local count = s - b

if count + cost > limit then
  -- Rejected, nothing written. The request fits once the (count + cost - limit)
  -- oldest entries in the window have left it; waits are measured from the
  -- request's own time, so they are never early for it.
  local blocking = o
  if count + cost - limit > 1 then blocking = entry(b + count + cost - limit - 1) end
  local remaining = limit - count
  if remaining < 0 then remaining = 0 end
  ok, left, retry_ms, reset_ms, decided_at = 0, remaining, blocking + window - now, newest + window - now, at
  break
end

if dry == 1 then
  -- A peek: the admission the check would make, without appending its entries.
  ok, left, retry_ms, reset_ms, decided_at = 1, limit - count - cost, 0, at + window - now, at
  break
end

local function enc(x)
  local hi = math.floor(x / 16777216)
  local lo = x - hi * 16777216
  return string.char(math.floor(hi / 65536), math.floor(hi / 256) % 256, hi % 256,
    math.floor(lo / 65536), math.floor(lo / 256) % 256, lo % 256)
end

-- Admitted: append `cost` entries stamped `at` to the head chunk.
if not h and #ARGV[3] == 18 and cost <= C then
  -- A new log: the header the client sent, then the entries.
  redis.call('HSET', key, 'h', ARGV[3] .. string.rep(string.sub(ARGV[3], 13, 18), cost))
  redis.call('PEXPIRE', key, ttl)
  ok, left, retry_ms, reset_ms, decided_at = 1, limit - cost, 0, window, now
  break
end
if not hc then hc, tc = s > 0 and math.floor((s - 1) / C) or 0, math.floor(b / C) end
local stamp = enc(at + OFFSET)
if count == 0 then o = at end
if (not h or (b < s and math.floor(b / C) == tc)) and s - hc * C + cost <= C then
  -- The usual case: a new log, or no chunk left behind; and the head has room.
  local kept, head = '', ''
  if h then kept, head = string.sub(h, 7, 18), string.sub(h, 19) end
  if not h or moved or count == 0 then kept = enc(b) .. enc(o + OFFSET) end
  redis.call('HSET', key, 'h', enc(s + cost) .. kept .. head .. string.rep(stamp, cost))
else
  -- Chunks b has passed are deleted (a log that has all left starts again from an
  -- empty key); full head chunks become the tail chunk or ones between.
  local fields = {}
  local function hset() -- in batches: Lua's unpack() is bounded
    if #fields > 0 then redis.call('HSET', key, unpack(fields)) end
    fields = {}
  end
  if h and b == s then
    redis.call('DEL', key)
    s, b, hc, tc, h = 0, 0, 0, 0, nil
  end
  local new_tc = math.floor(b / C)
  if new_tc > tc then
    local dead = {}
    for k = tc + 1, math.min(new_tc, hc - 1) do dead[#dead + 1] = tostring(k) end
    if new_tc < hc then
      local tail = loaded and loaded[new_tc] or redis.call('HGET', key, tostring(new_tc))
      fields[1], fields[2] = 't', tail
    else
      dead[#dead + 1] = 't'
    end
    for i = 1, #dead, 1000 do
      redis.call('HDEL', key, unpack(dead, i, math.min(i + 999, #dead)))
    end
    tc = new_tc
  end
  local head = h and string.sub(h, 19) or ''
  local unwritten = cost
  while unwritten > 0 do
    local room = C - #head / 6
    if room == 0 then
      fields[#fields + 1] = (hc == tc) and 't' or tostring(hc)
      fields[#fields + 1] = head
      hc, head, room = hc + 1, '', C
      if #fields >= 1000 then hset() end
    end
    local n = math.min(room, unwritten)
    head = head .. string.rep(stamp, n)
    unwritten = unwritten - n
  end
  fields[#fields + 1] = 'h'
  fields[#fields + 1] = enc(s + cost) .. enc(b) .. enc(o + OFFSET) .. head
  hset()
end

-- The key lives until its newest entry, stamped `at`, leaves the window.
if at == now then
  redis.call('PEXPIRE', key, ttl)
else
  redis.call('PEXPIRE', key, at + window - now + ttl_slack)
end
ok, left, retry_ms, reset_ms, decided_at = 1, limit - count - cost, 0, at + window - now, at
