"""What the sync and async Redis limiters share: the script, its arguments, decoding
its reply and the failure policy. No I/O happens here."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import redis.exceptions

from . import clock as clocks
from .decision import Decision
from .errors import RateLimiterUnavailable
from .policy import Policy
from .scripts import source

log = logging.getLogger("ratelimit")

# What "Redis could not answer" looks like: refused or dropped connections, replies
# that are errors (OOM, READONLY, LOADING...), and timeouts.
UNAVAILABLE = (redis.exceptions.RedisError, OSError, TimeoutError)

DEGRADED_RETRY_AFTER_MS = 1000


class LimiterBase(Policy):
    """A policy bound to a Redis client and its algorithm's Lua script."""

    def __init__(self, redis: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.redis = redis
        self._script = self._client_for_script(redis).register_script(source(self.algorithm.script))

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, on_error={self.on_error!r})"

    def _client_for_script(self, redis: Any) -> Any:
        return redis

    def _prepare(self, identity: str | bytes, cost: Any) -> tuple[list[str], list[Any]]:
        """Validate a request and build the script's KEYS and ARGV."""
        key = self.key_for(identity)
        cost = self.validate_cost(cost)
        now = clocks.now_ms(self.clock)
        now_arg = "" if now is None else now
        args = [now_arg, self.window_ms, self.limit, cost, self.ttl_slack_ms, *self.extra_args()]
        return [key], args

    def _prepare_many(
        self, identities: Iterable[str | bytes], costs: int | Iterable[int]
    ) -> list[tuple[list[str], list[Any]]]:
        """Validate a whole batch (nothing reaches Redis if any request is bad)."""
        identities = list(identities)
        if isinstance(costs, int) and not isinstance(costs, bool):
            costs = [costs] * len(identities)
        else:
            costs = list(costs)  # type: ignore[arg-type]
            if len(costs) != len(identities):
                raise ValueError(
                    f"costs must be one int or one per identity: {len(costs)} costs "
                    f"for {len(identities)} identities"
                )
        return [self._prepare(who, cost) for who, cost in zip(identities, costs, strict=True)]

    def _decision(self, reply: list[int]) -> Decision:
        allowed, remaining, retry_after_ms, reset_after_ms = (int(v) for v in reply[:4])
        return Decision(
            allowed=bool(allowed),
            limit=self.limit,
            remaining=remaining,
            retry_after_ms=retry_after_ms,
            reset_after_ms=reset_after_ms,
        )

    def _unavailable(self, exc: BaseException, what: str | None = None) -> Decision:
        """Apply the failure policy when Redis could not answer."""
        what = what or f"{type(exc).__name__}: {exc}"
        if self.on_error == "raise":
            raise RateLimiterUnavailable(f"rate limiter could not reach Redis: {what}") from exc
        log.warning("rate limiter degraded (on_error=%s): %s", self.on_error, what)
        if self.on_error == "allow":
            return Decision(True, self.limit, 0, 0, 0, degraded=True)
        return Decision(
            False, self.limit, 0, DEGRADED_RETRY_AFTER_MS, DEGRADED_RETRY_AFTER_MS, degraded=True
        )
