until true
-- The end of every limiter script (see prelude.lua): its answer. Turning a Lua table
-- into a Redis reply costs about as much server time as a whole Redis command, so
-- when the decision was made at the `now` the client sent, the five results travel
-- as one integer that the client takes apart (ratelimit/_core.py, `_decision`), with
-- L1 = 1 + the largest `left` and R = 2 * window + 1:
--   admitted:  reset_ms * L1 + left                              (>= 0; retry is 0)
--   rejected:  -1 - ((reset_ms * R + retry_ms) * L1 + left)      (< 0; 1 <= retry < R)
-- Anything else (a later decision time, Redis's own clock, numbers too large to be
-- exact in a double) is sent as the table {ok, left, retry_ms, reset_ms, decided_at}.
if sent and decided_at == now then
  local code
  if ok == 1 then
    code = reset_ms * L1 + left
  elseif retry_ms < R then
    code = -1 - ((reset_ms * R + retry_ms) * L1 + left)
  end
  -- Every step is exact while the result is (all terms are non-negative integers).
  if code and code < 9007199254740992 and code > -9007199254740992 then return code end
end
return {ok, left, retry_ms, reset_ms, decided_at}
