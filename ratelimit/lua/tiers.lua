-- Tiers: one identity under several limits at once ("10/s" and "1000/h"), each with its
-- own window and so its own key, decided in one script so that no other client's
-- check comes between the tiers.
--
-- ratelimit/scripts.py (`tiered`) writes this script as: the constant `dry` (1 for a
-- peek), prelude.lua (the time and cost, read once for every tier), then one function
-- per tier, `tiers[i](dry)`, which holds the tier's constants and its algorithm's file
-- and returns that file's five results for KEYS[i] (its ARGV[3], the state a key that
-- holds nothing takes, is ARGV[2 + i]); then this file.
--
-- Every tier first decides with dry = 1 (writing nothing). If one rejects, the request
-- is rejected and nothing is written in any tier: a rejected request spends nothing.
-- Otherwise every tier decides again with dry = 0 on the same state and at the same
-- time, which decides alike (a peek decides as the check would) and now writes.
-- The reply is {ok, left, retry_ms, reset_ms, decided_at, tier}: the results of the
-- tier that binds, and its number. A rejection is bound by the rejecting tier that
-- asks the longest wait, an admission by the tier with the fewest units left (ties:
-- the tier listed first). A tier's error reply is the script's.

local results, bind, rejected = {}, 0, false
for i = 1, #tiers do
  local r = {tiers[i](1)}
  if type(r[1]) == 'table' then return r[1] end
  results[i] = r
  if r[1] == 0 then
    if not rejected or r[3] > results[bind][3] then bind = i end
    rejected = true
  elseif not rejected and (bind == 0 or r[2] < results[bind][2]) then
    bind = i
  end
end
if not rejected and dry == 0 then
  for i = 1, #tiers do
    local r = {tiers[i](0)}
    if type(r[1]) == 'table' then return r[1] end
    results[i] = r
  end
end
local r = results[bind]
-- (Answered inside prelude.lua's loop, where `bind` is in scope.)
return {r[1], r[2], r[3], r[4], r[5], bind}
until true
