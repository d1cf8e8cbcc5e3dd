"""Tiers: one identity under several limits at once, as most public APIs publish them
("10 per second and 1,000 per hour").

    limiter = TieredLimiter(redis, ["10/s", "1000/h"])
    decision = await limiter.check("api-key-123")
    limiter.rates[decision.tier]          # the tier that binds: Rate(10, 1000)

One script decides every tier (`lua/tiers.lua`): a request is admitted only if every
tier admits it, and a rejected request spends nothing in any tier. Each tier keeps
its state in its own key, the key a single-rate limiter of the same algorithm, window
and prefix uses (`limiter.tiers[i].key_for(identity)`): a tier and such a limiter
share their history, and changing only a tier's limit keeps it. All of an identity's
keys hash to one Redis Cluster slot (the identity's digest is their hash tag).

This module holds what the asyncio and sync `TieredLimiter`s share; the classes are
in `ratelimit` and `ratelimit.sync`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from . import algorithms, scripts
from ._core import LimiterBase
from .algorithms import Algorithm, LogStorage
from .decision import Decision
from .rates import Rate, parse_rates

# Which algorithm every tier runs: a tag of `ratelimit.algorithms` ("log" keeps its
# entries in the storage `storage` names).
TierAlgorithm = Literal["log", "fw", "swc", "gcra"]

MAX_TIERS = 10  # more is a configuration slip; each tier adds a function to the script


def tier_algorithm(algorithm: Any, storage: Any) -> Algorithm:
    """The algorithm entry every tier runs (the log in `storage`, by default the
    log's default); ValueError for anything else."""
    entry = algorithms.get(algorithm) if isinstance(algorithm, str) else None
    if entry is None or entry not in algorithms.ALGORITHMS:
        raise ValueError(
            f"algorithm must be one of {', '.join(map(repr, algorithms.NAMES))}, got {algorithm!r}"
        )
    if entry.storage is not None:
        return algorithms.log_storage(storage or algorithms.DEFAULT_LOG_STORAGE)
    if storage is not None:
        raise ValueError(f"storage applies to the sliding log only, not to {algorithm!r}")
    return entry


def tier_rates(rates: Any) -> tuple[Rate, ...]:
    """The tiers' rates, shortest window first; ValueError for none, too many, or two
    with one window (they would count in one key: keep the lower limit)."""
    parsed = sorted(parse_rates(rates), key=lambda rate: rate.window_ms)
    if len(parsed) > MAX_TIERS:
        raise ValueError(f"at most {MAX_TIERS} tiers, got {len(parsed)}")
    for one, two in zip(parsed, parsed[1:], strict=False):
        if one.window_ms == two.window_ms:
            raise ValueError(
                f"two tiers with one window ({one} and {two}) would share a key: keep one"
            )
    return tuple(parsed)


def tier_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options each tier's limiter takes from a tiered limiter's `options` (all but
    `near_cache`); ValueError for the ones tiers refuse."""
    if options.get("near_cache"):
        raise ValueError("near_cache does not apply to tiers")
    if options.get("plain_keys"):
        # A plain key names neither the algorithm nor the window: every tier would
        # count in the same key.
        raise ValueError("plain_keys does not apply to tiers: each tier needs a key of its own")
    return {k: v for k, v in options.items() if k != "near_cache"}


class TieredCore(LimiterBase):
    """What the asyncio and sync `TieredLimiter`s share: the tiers, their one script,
    their keys and the decision of the tier that binds. `limit`, `window_ms`, `rate`
    and `key_for` are the first tier's (the shortest window); `rates`, `tiers` and
    `keys_for` are every tier's."""

    def __init__(
        self,
        redis: Any,
        rates: str | Rate | Iterable[str | Rate],
        prefix: str = "rl",
        *,
        algorithm: TierAlgorithm = "log",
        storage: LogStorage | None = None,
        **options: Any,
    ) -> None:
        entry = tier_algorithm(algorithm, storage)
        self.rates: tuple[Rate, ...] = tier_rates(rates)
        own = tier_options(options)
        # The tiers' algorithm is this limiter's (set once, before the common options).
        object.__setattr__(self, "algorithm", entry)
        kind: algorithms.Kind = "async" if self._asyncio else "sync"
        # Each tier is a single-rate limiter on the same client: its key, constants,
        # cost rule and state-opening text are what the tiered script uses, and a
        # caller may check, peek at or reset one tier alone through it.
        self.tiers: tuple[Any, ...] = tuple(
            entry.build(kind, redis, rate, prefix=prefix, **own) for rate in self.rates
        )
        super().__init__(redis, self.rates[0], None, prefix, **options)
        self._options.pop("window_ms")
        self._options.pop("limit")
        self._options.update(rates=[str(rate) for rate in self.rates], algorithm=algorithm)
        self._options["storage"] = storage
        self._max_cost = min(tier._max_cost for tier in self.tiers)
        self._openers = [tier._opener for tier in self.tiers]

    def _constants(self) -> dict[str, scripts.Constant]:
        # Each tier's function carries its own; these (the first tier's) only say
        # whether the script is a peek's.
        constants: dict[str, scripts.Constant] = self.tiers[0]._constants()
        return constants

    def _script_text(self, redis: Any, constants: dict[str, scripts.Constant]) -> str:
        tiers = [(tier.algorithm.script, tier._constants()) for tier in self.tiers]
        return scripts.tiered(tiers, redis, dry=int(constants["dry"]))

    def _rebuild(self, options: dict[str, Any]) -> Any:
        if "window_seconds" in options:
            raise TypeError(
                f"{type(self).__name__}'s limits are its rates: build a new one to change them"
            )
        return type(self)(self.redis, **options)

    def keys_for(self, identity: str | bytes) -> list[str]:
        """Every tier's key for `identity`, in the order of `rates`."""
        return [tier.key_for(identity) for tier in self.tiers]

    def validate_cost(self, cost: Any) -> int:
        """`cost` if every tier could admit it, else the ValueError of the first that
        could not."""
        for tier in self.tiers:
            tier.validate_cost(cost)
        return int(cost)

    def _prepare(self, identity: str | bytes, cost: Any) -> tuple[list[str], list[Any]]:
        keys, args = super()._prepare(identity, cost)  # the first tier's key
        keys += [tier.key_for(identity) for tier in self.tiers[1:]]
        return keys, args

    def script_args(self, now_arg: Any, cost: int) -> list[Any]:
        """ARGV of a check: its time and cost, then each tier's opening state (see
        lua/tiers.lua); "" where a tier has none or Redis's clock decides."""
        if now_arg == b"":
            return [now_arg, cost, *(b"" for _ in self._openers)]
        return [
            now_arg,
            cost,
            *(b"" if opener is None else opener(now_arg, cost) for opener in self._openers),
        ]

    def _reset_keys(self, identity: str | bytes) -> list[str]:
        return self.keys_for(identity)

    def _decision(self, reply: Any, now: Any = None) -> Decision:
        """The decision of the tier that binds (see lua/tiers.lua), its index in `rates`
        as `tier`."""
        allowed, remaining, retry_after_ms, reset_after_ms, decided_at = (int(v) for v in reply[:5])
        tier = int(reply[5]) - 1
        return Decision(
            allowed=bool(allowed),
            limit=self.rates[tier].limit,
            remaining=remaining,
            retry_after_ms=retry_after_ms,
            reset_after_ms=reset_after_ms,
            decided_at_ms=decided_at,
            tier=tier,
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(rates={[str(rate) for rate in self.rates]}, "
            f"algorithm={self.algorithm.name!r}, prefix={self.prefix!r}, "
            f"on_error={self.on_error!r})"
        )
