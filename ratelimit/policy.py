"""A limit policy: the validated options every limiter shares, Redis-backed or not.

The Redis limiters (`ratelimit.limiters`, `ratelimit.sync`) and the lab's in-memory
reference models (`ratelimit.lab.reference`) all build on `Policy`, so they accept the
same options and reject the same bad input with the same messages.

Options are fixed once a limiter is built: assigning one raises AttributeError.
`limiter.with_options(clock=..., ...)` builds a new limiter with some options changed
and leaves the original as it was (a replay drives such a copy on its virtual clock).
"""

from __future__ import annotations

import binascii
import enum
import hashlib
from typing import Any, ClassVar, Literal, Self

from . import algorithms, keys, validation
from . import clock as clocks
from .algorithms import Algorithm, LogStorage
from .rates import Rate, parse_rate

# What a limiter does when Redis cannot answer (see `on_error` in the README).
OnError = Literal["raise", "allow", "deny"]

VIRTUAL_CLOCK_TTL_SLACK_MS = 3_600_000
# How far ahead of Redis's clock a stored time is trusted, by default (real clocks only).
DEFAULT_CLOCK_TOLERANCE_MS = 1000

# Attributes that hold an option: set once in __init__, never again.
_FIXED = frozenset(
    {
        "algorithm", "window_ms", "limit", "prefix", "clock", "on_error", "timeout",
        "readable_keys", "ttl_slack_ms", "burst", "redis", "near_cache", "auto_pipeline",
        "wait_replicas", "clock_tolerance_ms", "plain_keys", "rates", "tiers",
    }
)  # fmt: skip



class _Unset(enum.Enum):
    """`with_options`'s default: the option keeps its value (None is a value of some)."""

    UNSET = "unset"


UNSET = _Unset.UNSET
Unset = Literal[_Unset.UNSET]

# Standard base64 -> URL-safe base64 (what `keys.digest` produces), without padding.
_URLSAFE = bytes.maketrans(b"+/", b"-_")


class Policy:
    """Window, limit, clock, keys and failure options, validated once."""

    algorithm: ClassVar[Algorithm]
    # The tolerance a real clock gets when none is given (see `clock_tolerance_ms`).
    default_clock_tolerance_ms: ClassVar[int | None] = DEFAULT_CLOCK_TOLERANCE_MS

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
        if isinstance(window_seconds, (str, Rate)):  # a rate in place of (window, limit)
            if limit is not None or window_ms is not None:
                raise ValueError(
                    f"window_seconds must be an integer, got {window_seconds!r}: give a "
                    "rate ('10/s') or a window and a limit, not both"
                )
            rate = parse_rate(window_seconds)
            window_seconds, window_ms, limit = None, rate.window_ms, rate.limit
        # What builds an equal policy (`with_options`), as given: a default left as None
        # is worked out again from the other options of the copy.
        self._options: dict[str, Any] = {
            "window_ms": validation.window_ms(window_seconds, window_ms),
            "limit": limit,
            "prefix": prefix,
            "clock": clock,
            "on_error": on_error,
            "timeout": timeout,
            "readable_keys": readable_keys,
            "plain_keys": plain_keys,
            "key_secret": key_secret,
            "ttl_slack_ms": ttl_slack_ms,
            "clock_tolerance_ms": clock_tolerance_ms,
        }
        self.window_ms: int = self._options["window_ms"]
        self.limit = validation.limit(limit, self.algorithm.max_limit)
        if self.algorithm.check_range is not None:
            self.algorithm.check_range(self.window_ms, self.limit)
        self.prefix = validation.prefix(prefix)
        self.clock = clocks.validate(clock)
        self.on_error = validation.on_error(on_error)
        self.timeout = validation.timeout(timeout)
        if not isinstance(readable_keys, bool):
            raise ValueError(f"readable_keys must be True or False, got {readable_keys!r}")
        self.readable_keys = readable_keys
        self._secret = keys.validate_secret(key_secret)
        if not isinstance(plain_keys, bool):
            raise ValueError(f"plain_keys must be True or False, got {plain_keys!r}")
        if plain_keys and (readable_keys or key_secret is not None):
            raise ValueError(
                "plain_keys stores the identity as it is: give it without readable_keys "
                "and key_secret, which shape a hashed key"
            )
        self.plain_keys = plain_keys
        self._hashed = not (plain_keys or readable_keys)
        # Redis expires keys in real time. Under an injected (virtual) clock that runs
        # slower than real time, a TTL of one window would drop state that is still
        # inside the virtual window, so such clocks get an hour of slack by default.
        # Extra TTL never changes a decision: every script ignores aged-out state.
        if ttl_slack_ms is None:
            real = clock is clocks.DEFAULT or clock == clocks.REDIS
            ttl_slack_ms = 0 if real else VIRTUAL_CLOCK_TTL_SLACK_MS
        self.ttl_slack_ms = validation.non_negative_int(
            "ttl_slack_ms", ttl_slack_ms, validation.MAX_WINDOW_MS
        )
        # A host whose clock runs far ahead (an NTP step, a VM restored from a snapshot)
        # stamps state that every later check would otherwise wait for. The scripts
        # trust a stored time only up to Redis's clock plus this many ms (see
        # lua/prelude.lua). A virtual clock's times have nothing to do with Redis's, so
        # by default it trusts every time (None here).
        if clock_tolerance_ms is None:
            real = clock is clocks.DEFAULT or clock == clocks.REDIS
            self.clock_tolerance_ms = self.default_clock_tolerance_ms if real else None
        else:
            self.clock_tolerance_ms = validation.non_negative_int(
                "clock_tolerance_ms", clock_tolerance_ms, validation.MAX_WINDOW_MS
            )
        # Hot-path caches (the options above never change after construction): the
        # largest valid cost, and the key's constant head "<prefix>:<algorithm>:<window>:{".
        self._max_cost = self.limit
        self._key_head = f"{self.prefix}:{self.algorithm.name}:{self.window_ms}:{{"
        self._more_options()

    def _more_options(self) -> None:
        """Validate a subclass's own options (called once the common ones are set)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _FIXED and (name in self.__dict__ or name == "algorithm"):
            raise AttributeError(
                f"{name} is fixed once a limiter is built; "
                f"limiter.with_options({name}=...) makes a new one"
            )
        object.__setattr__(self, name, value)

    def with_options(
        self,
        *,
        window_seconds: int | str | Rate | Unset = UNSET,
        limit: int | Unset = UNSET,
        window_ms: int | Unset = UNSET,
        prefix: str | Unset = UNSET,
        clock: clocks.Clock | Unset = UNSET,
        on_error: OnError | Unset = UNSET,
        timeout: float | Unset = UNSET,
        readable_keys: bool | Unset = UNSET,
        plain_keys: bool | Unset = UNSET,
        key_secret: bytes | None | Unset = UNSET,
        ttl_slack_ms: int | None | Unset = UNSET,
        clock_tolerance_ms: int | None | Unset = UNSET,
        storage: LogStorage | Unset = UNSET,
        burst: int | None | Unset = UNSET,
        near_cache: bool | int | Unset = UNSET,
        auto_pipeline: bool | Unset = UNSET,
        wait_replicas: int | Unset = UNSET,
    ) -> Self:
        """A new limiter like this one with the options given changed; this one is unchanged.

        `window_seconds` (or a rate string/`Rate`, which sets the limit too) replaces
        `window_ms`. `storage`, `burst`, `near_cache`, `auto_pipeline` and `wait_replicas`
        apply only where the constructor takes them (TypeError elsewhere). A Redis
        limiter's copy talks to the same client with a near-cache of its own.
        """
        given = {
            "window_seconds": window_seconds, "limit": limit, "window_ms": window_ms,
            "prefix": prefix, "clock": clock, "on_error": on_error, "timeout": timeout,
            "readable_keys": readable_keys, "plain_keys": plain_keys, "key_secret": key_secret,
            "ttl_slack_ms": ttl_slack_ms, "clock_tolerance_ms": clock_tolerance_ms,
            "storage": storage, "burst": burst, "near_cache": near_cache,
            "auto_pipeline": auto_pipeline, "wait_replicas": wait_replicas,
        }  # fmt: skip
        changes = {name: value for name, value in given.items() if value is not UNSET}
        options = dict(self._options)
        unknown = sorted(set(changes) - set(options) - {"window_seconds"})
        if unknown:
            raise TypeError(f"{type(self).__name__} has no option(s) {', '.join(unknown)}")
        if "window_seconds" in changes:
            options.pop("window_ms", None)
            if isinstance(changes["window_seconds"], (str, Rate)) and "limit" not in changes:
                del options["limit"]  # the rate gives both
        options.update(changes)
        return self._rebuild(options)

    def _rebuild(self, options: dict[str, Any]) -> Self:
        return type(self)(**options)

    @property
    def window_seconds(self) -> float:
        return float(self.window_ms / 1000)

    @property
    def rate(self) -> Rate:
        """The limit and window as one `Rate` (`str(limiter.rate) == "10/s"`)."""
        return Rate(self.limit, self.window_ms)

    def key_for(self, identity: str | bytes) -> str:
        """The Redis key that holds this identity's state: bounded and not readable by
        default, `<prefix>:<identity>` with `plain_keys` (see `ratelimit.keys`)."""
        if self._hashed and type(identity) is str and identity:
            # The same key as `keys.make_key`, built without its generic checks: this
            # runs on every check.
            raw = hashlib.blake2b(
                identity.encode("utf-8", "surrogatepass"),
                digest_size=16,
                key=self._secret or b"",
            ).digest()
            b64 = binascii.b2a_base64(raw, newline=False).translate(_URLSAFE)
            return self._key_head + b64[:22].decode("ascii") + "}"
        if self.plain_keys:
            return keys.plain_key(self.prefix, identity)
        return keys.make_key(
            self.prefix,
            self.algorithm.name,
            identity,
            window_ms=self.window_ms,
            secret=self._secret,
            readable=self.readable_keys,
        )

    def validate_cost(self, cost: Any) -> int:
        """`cost` if it is an integer from 1 to the limit, else ValueError."""
        return validation.cost(cost, self.limit)

    def state_ttl_ms(self) -> int:
        """How long the state a check writes at its own time can matter (the key's TTL
        before slack): a constant of the script, so it need not format a number."""
        return self.window_ms * self.algorithm.ttl_windows

    def max_remaining(self) -> int:
        """The largest `remaining` a decision can carry."""
        return self.limit

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(limit={self.limit}, window_ms={self.window_ms}, "
            f"prefix={self.prefix!r})"
        )


class LogPolicy(Policy):
    """The sliding log's extra option: where its entries live (`storage`, one of
    `algorithms.LOG_STORAGES`). Both storages decide alike; their keys differ."""

    # The default storage's; an instance built with another storage carries its own.
    algorithm = algorithms.LOG_STORAGES[algorithms.DEFAULT_LOG_STORAGE]

    def _use_storage(self, storage: LogStorage) -> None:
        """Take the `storage` option: called by a constructor before the common options,
        which read the storage's limits."""
        object.__setattr__(self, "algorithm", algorithms.log_storage(storage))
        self._storage_option = storage

    def _more_options(self) -> None:
        self._options["storage"] = self._storage_option
        super()._more_options()

    @property
    def storage(self) -> LogStorage:
        return self._storage_option


class GcraPolicy(Policy):
    """GCRA's extra option: how much cost may arrive at once (default: the limit)."""

    def _use_burst(self, burst: int | None) -> None:
        """Take the `burst` option: called by a constructor before the common options
        (checked once the limit is known)."""
        self._burst_option = burst

    def _more_options(self) -> None:
        burst = self._burst_option
        self._options["burst"] = burst
        self.burst = (
            self.limit
            if burst is None
            else validation.positive_int("burst", burst, validation.MAX_LIMIT)
        )
        self._max_cost = min(self.limit, self.burst)

    def state_ttl_ms(self) -> int:
        # The TAT is at most the tolerance (window * burst / limit) ahead of the time
        # it was written.
        return -(-self.window_ms * self.burst // self.limit)

    def max_remaining(self) -> int:
        return max(self.limit, self.burst)

    def validate_cost(self, cost: Any) -> int:
        valid = super().validate_cost(cost)
        if valid > self.burst:
            raise ValueError(f"cost must be <= burst ({self.burst}), got {valid}")
        return valid
