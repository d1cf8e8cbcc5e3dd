"""What the four reference models share: options, identity state, `check`."""

from __future__ import annotations

import copy
from typing import Any

from ratelimit import clock as clocks
from ratelimit import keys
from ratelimit.decision import Decision
from ratelimit.policy import OnError, Policy
from ratelimit.rates import Rate

# One group's decisions: allowed, remaining, retry_after_ms, reset_after_ms per request.
Outcome = tuple[list[bool], list[int], list[int], list[int]]


class ReferenceLimiter(Policy):
    """An in-memory twin of a Redis limiter: same options, same decisions.

    State lives in a dict, one entry per identity. Every decision is made by the
    subclass's `run`, which takes one identity's requests in time order; `check`
    runs it on a single request, and `ratelimit.lab.replay` on whole traces, so both
    paths share one statement of the algorithm. `clock="redis"` falls back to the
    host's clock, since there is no Redis to ask. For the same reason a model trusts
    every time it is given unless `clock_tolerance_ms` is set: its only clock is the
    requests' own.
    """

    default_clock_tolerance_ms = None

    def __init__(
        self,
        window_seconds: int | str | Rate | None = None,
        limit: int | None = None,
        prefix: str = "rl",
        *,
        window_ms: int | None = None,
        clock: clocks.Clock = clocks.DEFAULT,
        on_error: OnError = "raise",
        timeout: float = 1.0,
        readable_keys: bool = False,
        plain_keys: bool = False,
        key_secret: bytes | None = None,
        ttl_slack_ms: int | None = None,
        clock_tolerance_ms: int | None = None,
    ) -> None:
        super().__init__(
            window_seconds, limit, prefix, window_ms=window_ms, clock=clock,
            on_error=on_error, timeout=timeout, readable_keys=readable_keys, plain_keys=plain_keys,
            key_secret=key_secret, ttl_slack_ms=ttl_slack_ms,
            clock_tolerance_ms=clock_tolerance_ms,
        )  # fmt: skip
        self.state: dict[bytes, Any] = {}

    def now_ms(self) -> int:
        clock = clocks.DEFAULT if self.clock == clocks.REDIS else self.clock
        return clocks.to_ms(clock())  # type: ignore[operator]

    def check(self, identity: str | bytes, cost: int = 1, *, at_ms: int | None = None) -> Decision:
        """Admit or reject one request, exactly as the Lua script would; at `at_ms`
        rather than the clock's time when given (as the script takes the time it is
        sent)."""
        who = keys.identity_bytes(identity)
        cost = self.validate_cost(cost)
        now = self.now_ms() if at_ms is None else at_ms
        allowed, remaining, retry, reset = self.run(who, [now], [cost])
        return Decision(allowed[0], self.limit, remaining[0], retry[0], reset[0])

    def peek(self, identity: str | bytes, cost: int = 1, *, at_ms: int | None = None) -> Decision:
        """What `check` would return now (or at `at_ms`), changing no state (as the
        scripts' peek)."""
        who = keys.identity_bytes(identity)
        cost = self.validate_cost(cost)
        now = self.now_ms() if at_ms is None else at_ms
        missing = who not in self.state
        saved = copy.deepcopy(self.state.get(who))  # the log's stamps are a list
        try:
            allowed, remaining, retry, reset = self.run(who, [now], [cost])
        finally:
            if missing:
                self.state.pop(who, None)
            else:
                self.state[who] = saved
        return Decision(allowed[0], self.limit, remaining[0], retry[0], reset[0])

    def run(self, identity: bytes, times_ms: list[int], costs: list[int]) -> Outcome:
        """Decide a run of one identity's requests (whole ms, valid costs), in order."""
        raise NotImplementedError

    def reset(self, identity: str | bytes | None = None) -> bool:
        """Forget `identity`'s state (a fresh budget), or every identity's with None;
        True when there was state to forget, as the Redis limiters' `reset`."""
        if identity is None:
            had = bool(self.state)
            self.state.clear()
            return had
        return self.state.pop(keys.identity_bytes(identity), None) is not None
