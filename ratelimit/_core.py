"""What the sync and async limiters share: configuration, keys, script arguments,
decoding the script's reply and the failure policy. No I/O happens here."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import redis.exceptions

from . import clock as clocks
from . import keys, validation
from .algorithms import Algorithm
from .decision import Decision
from .errors import RateLimiterUnavailable
from .scripts import source

log = logging.getLogger("ratelimit")

# What "Redis could not answer" looks like: refused or dropped connections, replies
# that are errors (OOM, READONLY, LOADING...), and timeouts.
UNAVAILABLE = (redis.exceptions.RedisError, OSError, TimeoutError)

DEGRADED_RETRY_AFTER_MS = 1000


class LimiterBase:
    """Configuration and decoding shared by every limiter class."""

    algorithm: ClassVar[Algorithm]

    def __init__(
        self,
        redis: Any,
        window_seconds: int | None = None,
        limit: int | None = None,
        prefix: str = "rl",
        *,
        window_ms: int | None = None,
        clock: clocks.Clock = clocks.DEFAULT,
        on_error: str = "raise",
        timeout: float = 1.0,
        readable_keys: bool = False,
        key_secret: bytes | None = None,
    ) -> None:
        self.window_ms = validation.window_ms(window_seconds, window_ms)
        self.limit = validation.limit(limit)
        self.prefix = validation.prefix(prefix)
        self.clock = clocks.validate(clock)
        self.on_error = validation.on_error(on_error)
        self.timeout = validation.timeout(timeout)
        self.readable_keys = bool(readable_keys)
        self._secret = keys.validate_secret(key_secret)
        self.redis = redis
        self._script = self._client_for_script(redis).register_script(source(self.algorithm.script))

    @property
    def window_seconds(self) -> float:
        return self.window_ms / 1000

    def key_for(self, identity: str | bytes) -> str:
        """The Redis key that holds this identity's state (bounded, not readable)."""
        return keys.make_key(
            self.prefix,
            self.algorithm.name,
            identity,
            secret=self._secret,
            readable=self.readable_keys,
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(limit={self.limit}, window_ms={self.window_ms}, "
            f"prefix={self.prefix!r}, on_error={self.on_error!r})"
        )

    # Hooks for subclasses and the sync/async front ends.

    def _client_for_script(self, redis: Any) -> Any:
        return redis

    def _extra_args(self) -> tuple[int, ...]:
        return ()

    def _validate_cost(self, cost: Any) -> int:
        return validation.cost(cost, self.limit)

    def _prepare(self, identity: str | bytes, cost: Any) -> tuple[list[str], list[Any]]:
        """Validate a request and build the script's KEYS and ARGV."""
        key = self.key_for(identity)
        cost = self._validate_cost(cost)
        now = clocks.now_ms(self.clock)
        now_arg = "" if now is None else now
        return [key], [now_arg, self.window_ms, self.limit, cost, *self._extra_args()]

    def _decision(self, reply: list[int]) -> Decision:
        allowed, remaining, retry_after_ms, reset_after_ms = (int(v) for v in reply[:4])
        return Decision(
            allowed=bool(allowed),
            limit=self.limit,
            remaining=remaining,
            retry_after_ms=retry_after_ms,
            reset_after_ms=reset_after_ms,
        )

    def _unavailable(self, exc: BaseException) -> Decision:
        """Apply the failure policy when Redis could not answer."""
        if self.on_error == "raise":
            raise RateLimiterUnavailable(
                f"rate limiter could not reach Redis: {type(exc).__name__}: {exc}"
            ) from exc
        log.warning(
            "rate limiter degraded (on_error=%s): %s: %s", self.on_error, type(exc).__name__, exc
        )
        if self.on_error == "allow":
            return Decision(True, self.limit, 0, 0, 0, degraded=True)
        return Decision(
            False, self.limit, 0, DEGRADED_RETRY_AFTER_MS, DEGRADED_RETRY_AFTER_MS, degraded=True
        )


class GcraOptions(LimiterBase):
    """GCRA's extra option: how much cost may arrive at once (default: the limit)."""

    def __init__(self, *args: Any, burst: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.burst = (
            self.limit
            if burst is None
            else validation.positive_int("burst", burst, validation.MAX_LIMIT)
        )

    def _extra_args(self) -> tuple[int, ...]:
        return (self.burst,)

    def _validate_cost(self, cost: Any) -> int:
        cost = super()._validate_cost(cost)
        if cost > self.burst:
            raise ValueError(f"cost must be <= burst ({self.burst}), got {cost}")
        return cost
