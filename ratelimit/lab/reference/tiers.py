"""Tiers, as in lua/tiers.lua: one identity under several rates, each tier the
reference model of the tiers' algorithm.

Every tier first decides as a peek, at one time. If any rejects, the request is
rejected and no tier changes; the rejecting tier that asks the longest wait binds
(ties: the first). Otherwise every tier checks, and the tier with the fewest units
left binds (ties: the first). The decision is the binding tier's, with `tier` its
index in `rates`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from ratelimit import clock as clocks
from ratelimit import keys
from ratelimit.algorithms import LogStorage
from ratelimit.decision import Decision
from ratelimit.policy import OnError
from ratelimit.rates import Rate
from ratelimit.tiers import TierAlgorithm, tier_algorithm, tier_options, tier_rates

from .base import ReferenceLimiter


class TieredLimiter:
    """An in-memory twin of `ratelimit.TieredLimiter`: same options, same decisions.
    `tiers` are the algorithm's reference models, one per rate, shortest window first."""

    def __init__(
        self,
        rates: str | Rate | Iterable[str | Rate],
        prefix: str = "rl",
        *,
        algorithm: TierAlgorithm = "log",
        storage: LogStorage | None = None,
        clock: clocks.Clock = clocks.DEFAULT,
        on_error: OnError = "raise",
        timeout: float = 1.0,
        readable_keys: bool = False,
        plain_keys: bool = False,
        key_secret: bytes | None = None,
        ttl_slack_ms: int | None = None,
        clock_tolerance_ms: int | None = None,
    ) -> None:
        entry = tier_algorithm(algorithm, storage)
        self.rates: tuple[Rate, ...] = tier_rates(rates)
        options = tier_options(
            dict(
                prefix=prefix, clock=clock, on_error=on_error, timeout=timeout,
                readable_keys=readable_keys, plain_keys=plain_keys, key_secret=key_secret,
                ttl_slack_ms=ttl_slack_ms, clock_tolerance_ms=clock_tolerance_ms,
            )
        )  # fmt: skip
        self.algorithm = entry
        self.tiers: tuple[ReferenceLimiter, ...] = tuple(
            entry.build("reference", rate, **options) for rate in self.rates
        )

    @property
    def limit(self) -> int:
        """The first tier's limit (the shortest window's), as the Redis limiter's."""
        return self.rates[0].limit

    def keys_for(self, identity: str | bytes) -> list[str]:
        """Every tier's key for `identity`, in the order of `rates`."""
        return [tier.key_for(identity) for tier in self.tiers]

    def validate_cost(self, cost: Any) -> int:
        """`cost` if every tier could admit it, else the first refusing tier's ValueError."""
        for tier in self.tiers:
            tier.validate_cost(cost)
        return int(cost)

    def check(self, identity: str | bytes, cost: int = 1) -> Decision:
        """Admit or reject one request in every tier at once, as the script would."""
        return self._decide(identity, cost, dry=False)

    def peek(self, identity: str | bytes, cost: int = 1) -> Decision:
        """What `check` would return now, changing no tier."""
        return self._decide(identity, cost, dry=True)

    def reset(self, identity: str | bytes | None = None) -> bool:
        """Forget `identity` (or everyone, with None) in every tier; True when any tier
        had state to forget."""
        return any([tier.reset(identity) for tier in self.tiers])

    def _decide(self, identity: str | bytes, cost: int, *, dry: bool) -> Decision:
        keys.identity_bytes(identity)  # a bad identity is refused before any tier runs
        cost = self.validate_cost(cost)
        now = self.tiers[0].now_ms()  # one time for every tier, as the script's
        said = [tier.peek(identity, cost, at_ms=now) for tier in self.tiers]
        refused = [i for i, decision in enumerate(said) if not decision.allowed]
        if refused:
            bind = max(refused, key=lambda i: (said[i].retry_after_ms, -i))
            return dataclasses.replace(said[bind], tier=bind)
        if not dry:
            said = [tier.check(identity, cost, at_ms=now) for tier in self.tiers]
        bind = min(range(len(said)), key=lambda i: (said[i].remaining, i))
        return dataclasses.replace(said[bind], tier=bind)
