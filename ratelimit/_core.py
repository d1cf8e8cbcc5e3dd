"""What the sync and async Redis limiters share: the script, its arguments, decoding
its reply and the failure policy. No I/O happens here."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

import redis.exceptions

from . import clock as clocks
from . import nearcache
from .cluster_client import guarded
from .decision import Decision
from .errors import RateLimiterUnavailable
from .policy import Policy
from .scripts import source

log = logging.getLogger("ratelimit")

# What "Redis could not answer" looks like: refused or dropped connections, replies
# that are errors (OOM, READONLY, LOADING...), and timeouts.
UNAVAILABLE = (redis.exceptions.RedisError, OSError, TimeoutError)

DEGRADED_RETRY_AFTER_MS = 1000

_monotonic = time.monotonic  # the near-cache's clock under clock="redis" (tests replace it)


class LimiterBase(Policy):
    """A policy bound to a Redis client and its algorithm's Lua script."""

    def __init__(
        self, redis: Any, *args: Any, near_cache: bool | int = False, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.redis = redis
        # Opt-in local memory of rejections (see ratelimit.nearcache); None when off.
        size = nearcache.max_entries(near_cache)
        self._options["near_cache"] = near_cache
        self.near_cache = (
            None if size is None else nearcache.NearCache(self.algorithm, self.limit, size)
        )
        self._script = self._client_for_script(redis).register_script(source(self.algorithm.script))
        # The hot path calls EVALSHA on the client itself (see `_call`) with the
        # constant arguments already encoded, and reads the host's clock directly.
        self._client = self._script.registered_client
        self._host_clock = self.clock is clocks.DEFAULT
        self._window_arg = str(self.window_ms).encode()
        self._limit_arg = str(self.limit).encode()
        tail = (self.ttl_slack_ms, self.state_ttl_ms() + self.ttl_slack_ms, *self.extra_args())
        self._argv_tail = tuple(str(v).encode() for v in tail)
        # The radixes of a one-integer reply (lua/prelude.lua).
        self._limit_base = self.max_remaining() + 1
        self._retry_base = 2 * self.window_ms + 1

    def _rebuild(self, options: dict[str, Any]) -> Any:
        return type(self)(self.redis, **options)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, on_error={self.on_error!r})"

    def _client_for_script(self, redis: Any) -> Any:
        return guarded(redis)  # an asyncio RedisCluster gets a guard; see cluster_client

    def _local_ms(self, now_arg: Any) -> float:
        """The near-cache's time for a check: the script's own `now` when the limiter
        sends it, else (clock="redis") the host's monotonic clock in ms."""
        return now_arg if now_arg != b"" else _monotonic() * 1000

    def _cached(self, keys: list[str], args: list[Any]) -> tuple[Decision | None, float]:
        """A rejection the near-cache still holds for this check (None: ask Redis), and
        the check's time on the cache's clock, to pass on to `_learn`."""
        sent = self._local_ms(args[0])
        return self.near_cache.lookup(keys[0], args[3], sent), sent  # type: ignore[union-attr]

    def _learn(self, keys: list[str], args: list[Any], decision: Decision, sent: float) -> None:
        """Tell the near-cache what Redis decided."""
        cache = self.near_cache
        if decision.allowed:  # new entries: a cached rejection's retry is stale
            cache.forget(keys[0])  # type: ignore[union-attr]
        else:
            cache.remember(keys[0], args[3], decision, sent, self._local_ms(args[0]))  # type: ignore[union-attr]

    def _prepare(self, identity: str | bytes, cost: Any) -> tuple[list[str], list[Any]]:
        """Validate a request and build the script's KEYS and ARGV."""
        key = self.key_for(identity)
        if type(cost) is not int or not 0 < cost <= self._max_cost:
            cost = self.validate_cost(cost)  # raises the ValueError that names the problem
        if self._host_clock:
            now_arg: Any = int(self.clock() * 1000)  # type: ignore[operator]  # == to_ms
        else:
            now = clocks.now_ms(self.clock)
            now_arg = b"" if now is None else now
        args = [now_arg, self._window_arg, self._limit_arg, cost, *self._argv_tail]
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

    def _decision(self, reply: int | list[int], now: Any = None) -> Decision:
        """The `Decision` in a script's reply; `now` is the time the check sent (its
        ARGV[1]), the decision time of a reply that is one integer."""
        if type(reply) is int:
            # One integer: see "reply" in lua/prelude.lua.
            if reply >= 0:
                reset, remaining = divmod(reply, self._limit_base)
                return Decision(True, self.limit, remaining, 0, reset, decided_at_ms=now)
            rest, remaining = divmod(-1 - reply, self._limit_base)
            reset, retry = divmod(rest, self._retry_base)
            return Decision(False, self.limit, remaining, retry, reset, decided_at_ms=now)
        allowed, remaining, retry_after_ms, reset_after_ms = (int(v) for v in reply[:4])
        return Decision(
            allowed=bool(allowed),
            limit=self.limit,
            remaining=remaining,
            retry_after_ms=retry_after_ms,
            reset_after_ms=reset_after_ms,
            decided_at_ms=int(reply[4]) if len(reply) > 4 else None,
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
